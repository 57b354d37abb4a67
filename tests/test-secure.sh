#!/bin/sh
# test-secure.sh - a process in secure-execution mode (here: a setgid copy of
# tests/secure-helper, so AT_SECURE is set by the kernel for real, not simulated) ignores
# BP_PLUGIN_PATH and BP_PLUGIN_SYSTEM_PATH, while the same program without setgid uses them.
# Needs root (to give the copy away to another group); exits 77 otherwise, or when the file
# system does not honour setgid (mounted nosuid).
set -u
[ "$(id -u)" -eq 0 ] || { echo "SKIP: not root: cannot make a setgid copy for another group"; exit 77; }
helper="${top_builddir:-.}/tests/.libs/secure-helper"
[ -x "$helper" ] || helper="${top_builddir:-.}/tests/secure-helper"
cpu="$BP_TEST_CPU_PLUGIN_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
cp "$helper" "$work/helper"
pass=0
fail=0
check() { # description, command...
    if sh -c "$2" >"$work/out" 2>&1; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1"; sed 's/^/    /' "$work/out"; fi
}
export BP_PLUGIN_PATH="$cpu" BP_PLUGIN_SYSTEM_PATH="$cpu" BP_LOG_LEVEL=none
plain=$("$work/helper")
check "without setgid the environment is used" "echo '$plain' | grep -q '^at_secure=0' && echo '$plain' | grep -q 'record loaded $cpu' && ! echo '$plain' | grep -q '^devices=0'"
chgrp nogroup "$work/helper" && chmod 2755 "$work/helper"
secure=$("$work/helper")
if echo "$secure" | grep -q '^at_secure=0'; then
    echo "SKIP: the file system does not honour setgid here (nosuid?)"
    exit 77
fi
check "setgid runs in secure-execution mode" "echo '$secure' | grep -q '^at_secure=1'"
check "BP_PLUGIN_PATH and BP_PLUGIN_SYSTEM_PATH are ignored" "! echo '$secure' | grep -q '$cpu'"
echo "$pass passed, $fail failed"
test "$fail" -eq 0
