# check.sh - sourced by the shell suites (test-run.sh, test-docs.sh, test-headers.sh): counters,
# a scratch directory removed on exit, and check(), which runs one command and on failure prints
# its description and output. Each suite ends with: echo "$pass passed, $fail failed".
pass=0
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { # description, command...
    desc=$1
    shift
    if "$@" >"$tmp/out" 2>&1; then
        pass=$((pass + 1))
    else
        fail=$((fail + 1))
        echo "FAIL: $desc"
        sed 's/^/    /' "$tmp/out"
    fi
}
