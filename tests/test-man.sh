#!/bin/sh
# test-man.sh - the manual page docs/backplane.1 against the command it documents: every option
# that `backplane help` and `backplane <command> --help` print, and every variable of README.md's
# environment table, appears in it; make install puts it in man1; groff, where installed, reads
# it without a warning. Run by make check.
set -u
srcdir=${srcdir:-.}
builddir=${top_builddir:-.}
tool="$builddir/tools/backplane"
page="$srcdir/docs/backplane.1"
. "$(dirname "$0")/check.sh"
# No plugin is loaded: the help texts do not depend on them.
export BP_PLUGIN_PATH= BP_PLUGIN_SYSTEM_PATH= BP_LOG_LEVEL=none
LC_ALL=C
export LC_ALL

# The page as text: roff comments dropped, font changes and escaped hyphens undone, request
# names taken off the start of lines.
sed -e '/^\.\\"/d' -e 's/\\f[BIRP]//g' -e 's/\\-/-/g' -e 's/^\.[A-Za-z][A-Za-z]* *//' \
    "$page" >"$tmp/page"

# options FILE - the options (-x, --long-name) a help text names, one a line.
options() {
    grep -oE '(^|[][ (,|])--?[A-Za-z][A-Za-z0-9-]*' "$1" | sed 's/^[^-]*//' | sort -u
}
# missing LIST TEXT - the words of LIST (one a line) that TEXT does not contain as whole words
# (an option's or variable's own characters on neither side); prints them and fails if any.
missing() {
    status=0
    while read -r w; do
        if ! grep -qE -e "(^|[^A-Za-z0-9_-])$w([^A-Za-z0-9_-]|\$)" "$2"; then
            echo "$w is not in $page"
            status=1
        fi
    done <"$1"
    return $status
}

# The matching itself, on a help text whose answer is known: an option the page has passes,
# one it lacks (or has only as the start of a longer one) is reported.
printf '  --model M  [-d LIST] (-t N, --expert or --no-such-option)\n' >"$tmp/fake-help"
options "$tmp/fake-help" >"$tmp/fake-opts"
check "options() finds the five options of a made-up help text" \
    sh -c "printf '%s\n' --expert --model --no-such-option -d -t | diff - '$tmp/fake-opts'"
missing "$tmp/fake-opts" "$tmp/page" >"$tmp/fake-missing"
check "missing() reports exactly the options the page lacks (--expert only starts --expert-cache)" \
    sh -c "printf '%s\n' '--expert is not in $page' '--no-such-option is not in $page' |
           diff - '$tmp/fake-missing'"

# The help of the command and of each command it lists.
"$tool" help >"$tmp/help" 2>&1
check "backplane help exits 0 and lists its commands" grep -q '^commands:' "$tmp/help"
cmds=$(sed -n '/^commands:/,/^$/p' "$tmp/help" | grep -oE '^  [a-z]+' | sort -u)
check "backplane help lists run, bench and conformance" \
    sh -c "echo '$cmds' | grep -qx '  run' && echo '$cmds' | grep -qx '  bench' &&
           echo '$cmds' | grep -qx '  conformance'"
cp "$tmp/help" "$tmp/all-help"
for c in $cmds; do
    timeout 60 "$tool" "$c" --help >"$tmp/help-$c" 2>&1
    cat "$tmp/help-$c" >>"$tmp/all-help"
    check "backplane $c is documented in the page" grep -qE "^$c([ ,]|\$)" "$tmp/page"
done
options "$tmp/all-help" >"$tmp/opts"
check "the help texts name run's options (--model, --gguf, -d)" \
    sh -c "grep -qx -e --model '$tmp/opts' && grep -qx -e --gguf '$tmp/opts' &&
           grep -qx -e -d '$tmp/opts'"
check "every option the help texts print is in the page" missing "$tmp/opts" "$tmp/page"

# Every variable of the README's environment table (which tests/test-docs.sh keeps equal to
# what the code reads), and those of the help's environment line.
{
    sed -n '/^## Environment/,/^## /p' "$srcdir/README.md" | grep '^| `' | cut -d'|' -f2
    sed -n '/^environment:/,$p' "$tmp/help"
} | grep -oE 'BP_[A-Z0-9_]+' | sort -u >"$tmp/vars"
check "the README's environment table is found" test "$(wc -l <"$tmp/vars")" -ge 10
check "every variable of the README's table is in the page" missing "$tmp/vars" "$tmp/page"

sections() {
    for s in NAME SYNOPSIS DESCRIPTION 'EXIT STATUS' ENVIRONMENT FILES; do
        grep -qxE "\.SH \"?$s\"?" "$page" || { echo "no section $s"; return 1; }
    done
}
check "the page has the sections a manual page needs" sections
installs() {
    ${MAKE:-make} -s -C "$builddir" install-man1 DESTDIR="$tmp/dest" &&
        find "$tmp/dest" -path '*/share/man/man1/backplane.1' | grep -q .
}
check "make install puts the page in man1" installs
if command -v groff >/dev/null 2>&1; then
    groff_clean() {
        groff -man -ww -z "$page" 2>"$tmp/groff" && ! test -s "$tmp/groff" ||
            { cat "$tmp/groff"; return 1; }
    }
    check "groff reads the page without a warning" groff_clean
fi
echo "$pass passed, $fail failed"
test "$fail" -eq 0
