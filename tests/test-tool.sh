#!/bin/sh
# test-tool.sh - the `backplane` command-line tool against the test plugins: version, list,
# list --json, and its errors. Run by make check (automake's test driver judges the exit code).
set -u
tool="${top_builddir:-.}/tools/backplane"
export BP_PLUGIN_PATH="$BP_TEST_PLUGIN_DIR" BP_PLUGIN_SYSTEM_PATH= BP_LOG_LEVEL=none
pass=0
fail=0
check() { # description, command...
    desc=$1
    shift
    if "$@" >/dev/null 2>&1; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc"
    fi
}
out=$("$tool" list)
json=$("$tool" list --json)
check "version prints the version" sh -c "'$tool' version | grep -q '^backplane [0-9]'"
check "list shows the loaded plugin" sh -c "echo \"\$1\" | grep -q 'loaded .*backplane-good.so'" - "$out"
check "list gives the dlopen reason" sh -c "echo \"\$1\" | grep -q 'libbpmissing.so: cannot open shared object file'" - "$out"
check "list shows both devices of good" sh -c "echo \"\$1\" | grep -q '^  GOOD1 '" - "$out"
check "list shows device memory and caps" sh -c "echo \"\$1\" | grep -q 'memory 3.0 of 4.0 MiB free, caps: events'" - "$out"
check "json has the failed records" sh -c "echo \"\$1\" | grep -q '\"status\": \"failed\"'" - "$json"
check "json has the devices" sh -c "echo \"\$1\" | grep -q '\"name\": \"GOOD0\", \"description\"'" - "$json"
check "json escapes and closes" sh -c "echo \"\$1\" | tail -n 1 | grep -q '^}$'" - "$json"
check "BP_PLUGINS_DISABLE is honoured" sh -c "BP_PLUGINS_DISABLE=good '$tool' list | grep -q 'filtered .*backplane-good.so'"
check "unknown command exits 2" sh -c "'$tool' frobnicate; test \$? -eq 2"
check "unknown list option exits 2" sh -c "'$tool' list --yaml; test \$? -eq 2"
if command -v python3 >/dev/null 2>&1; then
    check "json parses" sh -c "echo \"\$1\" | python3 -m json.tool" - "$json"
fi
echo "$pass passed, $fail failed"
test "$fail" -eq 0
