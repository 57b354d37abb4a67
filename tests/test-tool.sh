#!/bin/sh
# test-tool.sh - the `backplane` command-line tool against the test plugins: version, list,
# list --json (also with hostile file names, for list and run), and its errors. Run by make
# check (automake's test driver judges the exit code).
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
check "list says why a lying plugin's device is not used" sh -c "BP_PLUGIN_PATH='$BP_TEST_LIAR_PLUGIN_DIR' BP_TEST_LIE=name-null '$tool' list | grep -q \"plugin 'liar': device 0 has no name (get_name returned NULL); the device is not used\""
check "list shows a lying plugin's honest device" sh -c "BP_PLUGIN_PATH='$BP_TEST_LIAR_PLUGIN_DIR' BP_TEST_LIE=name-null '$tool' list | grep -q '^  LIAR1 '"
check "unknown command exits 2" sh -c "'$tool' frobnicate; test \$? -eq 2"
check "unknown list option exits 2" sh -c "'$tool' list --yaml; test \$? -eq 2"
if command -v python3 >/dev/null 2>&1; then
    check "json parses" sh -c "echo \"\$1\" | python3 -m json.tool" - "$json"
fi
if [ -w /dev/full ]; then
    check "list output to a full disk exits 1" sh -c "'$tool' list --json >/dev/full 2>/dev/null; test \$? -eq 1"
fi

# Hostile file names through every JSON output: a plugin directory whose name holds '"', '\',
# a newline, a tab, DEL and bytes that are not UTF-8 (0xff, an overlong '/', a surrogate, a
# sequence cut short), beside valid 2- and 4-byte characters, with copies of the CPU plugin
# (loaded, so `run --json` prints its path) and a junk file of the same hostile name (refused,
# listed by `list --json`). Each document must be strict JSON in strict UTF-8 and give the names
# back as they are, with U+FFFD where Python's decoder puts it.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
evil=$(printf 'x"\\\n\t\177\377|\300\257|\355\240\200|\342\202|\303\251\360\237\230\200y')
EVIL_DIR="$tmp/$evil"
export EVIL_DIR
mkdir -m 700 "$EVIL_DIR"
cp "$BP_TEST_CPU_PLUGIN_DIR"/backplane-cpu*.so "$EVIL_DIR/"
printf 'junk' > "$EVIL_DIR/backplane-$evil.so"
cat > "$tmp/strict.py" <<'PY'
import json, os, sys
raw = sys.stdin.buffer.read()
text = raw.decode("utf-8", "strict")  # bytes that are not UTF-8 raise
def no_constant(name):
    raise ValueError("not JSON: " + name)
doc = json.loads(text, parse_constant=no_constant)  # raw control characters in strings raise
json.dumps(doc, ensure_ascii=False).encode("utf-8", "strict")  # lone surrogates raise
evil_dir = os.environb[b"EVIL_DIR"]
want = evil_dir.decode("utf-8", "replace")
base = os.path.basename(evil_dir).decode("utf-8", "replace")
if sys.argv[1] == "list":
    paths = [p["path"] for p in doc["plugins"]]
    assert any(p.startswith(want + "/backplane-cpu") for p in paths), paths
    junk = [p for p in doc["plugins"] if p["path"] == want + "/backplane-" + base + ".so"]
    assert len(junk) == 1 and junk[0]["status"] == "refused", paths
else:
    assert doc["devices"][0]["plugin"].startswith(want + "/backplane-cpu"), doc["devices"]
PY
if command -v python3 >/dev/null 2>&1; then
    check "list --json gives hostile file names back in strict JSON" sh -c "BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' list --json | python3 '$tmp/strict.py' list"
    check "run --json gives a hostile plugin path back in strict JSON" sh -c "BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' run -n 2 --json | python3 '$tmp/strict.py' run"
else
    fail=$((fail + 1))
    echo "FAIL: python3 (tools/build-deps.txt) is needed to check the JSON outputs"
fi
# The same names in the text outputs: control characters come out as C escapes, so the name
# cannot start a line of its own or send DEL to the terminal.
escaped=$(printf 'x"\\\\n\\t\\x7f')
check "list prints hostile file names with escapes" sh -c "out=\$(BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' list) && printf '%s' \"\$out\" | grep -qF '$escaped' && ! printf '%s' \"\$out\" | grep -q \"\$(printf '\\177')\""
check "run prints a hostile plugin path with escapes" sh -c "BP_PLUGIN_PATH=\"\$EVIL_DIR\" '$tool' run -n 2 | grep -a '(plugin ' | grep -aqF '$escaped'"
echo "$pass passed, $fail failed"
test "$fail" -eq 0
