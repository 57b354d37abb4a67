#!/bin/sh
# test-function-length.sh - no function in runtime/ or plugins/ (C, headers and CUDA) is longer
# than 100 lines, counted from the line of its opening brace to the line of its closing one.
# Run by make check; each offender is printed as file:line: name: N lines.
#
# The code puts a function's opening brace alone at column 0 on the line after its signature
# and the closing brace at column 0, and nothing else in a body starts at column 0 with a
# brace (struct and array bodies open on their declaration's line and close with "};"). A
# signature with its brace on the same line ("f(void) {") is counted too, from that line.
# The scanner is tried first on made-up files, so that a check that stopped finding long
# functions would fail instead of passing quietly.
set -u
srcdir=${srcdir:-.}
limit=100
. "$(dirname "$0")/check.sh"

# scan FILE... - prints "file:line: name: N lines" for each function body over $limit lines.
scan() {
    awk -v limit="$limit" '
    FNR == 1 { body = 0; sig = "" }
    # The signature is what was written since the last blank line, preprocessor line, or
    # line that ended a declaration, statement, comment or body.
    function signame(s,    t) {
        t = s
        while (match(t, /[A-Za-z_][A-Za-z0-9_]*[ \t]*\(/)) {
            name = substr(t, RSTART, RLENGTH)
            sub(/[ \t]*\($/, "", name)
            if (name !~ /^(__attribute__|__launch_bounds__|__declspec|alignas|_Alignas)$/)
                return name
            t = substr(t, RSTART + RLENGTH)
        }
        return "?"
    }
    !body && /^\{/ { body = 1; start = FNR; fname = signame(sig); next }
    !body && /^[A-Za-z_].*\)[ \t]*\{[ \t]*$/ && !/=/ && !/^(struct|union|enum|typedef)[ \t]/ {
        body = 1; start = FNR; fname = signame(sig " " $0); next
    }
    body && /^\}/ {
        body = 0; sig = ""
        n = FNR - start + 1
        if (n > limit)
            printf "%s:%d: %s: %d lines\n", FILENAME, start, fname, n
        next
    }
    !body {
        if ($0 ~ /^[ \t]*$/ || $0 ~ /^#/ || $0 ~ /[;}][ \t]*$/ || $0 ~ /\*\/[ \t]*$/)
            sig = ""
        else
            sig = sig " " $0
    }
    ' "$@"
}

# body FIRST LAST - a function of LAST - FIRST + 1 lines, braces included.
body() {
    printf '{\n'
    i=$(($1 + 1))
    while [ "$i" -lt "$2" ]; do
        printf '    x += %d;\n' "$i"
        i=$((i + 1))
    done
    printf '}\n'
}

# The scanner against a file whose answer is known: a function of exactly 100 lines passes, one
# of 101 (brace on its own line, with a multi-line signature and an attribute) and one of 102
# (brace on the signature's line) are reported with their names, lines and lengths.
{
    printf '/* a comment */\nstatic int fits(int x)\n'
    body 1 100
    printf '\nstruct s {\n    int a;\n};\n\n'
    printf '__attribute__((unused)) static int\ntoo_long(int x,\n         int y)\n'
    body 1 101
    printf '\nint same_line(int x) {\n'
    body 1 102 | sed 1d
} >"$tmp/long.c"
scan "$tmp/long.c" | sed "s|^$tmp/||" >"$tmp/found"
long_start=$(grep -n '^         int y)$' "$tmp/long.c" | cut -d: -f1)
same_start=$(grep -n '^int same_line' "$tmp/long.c" | cut -d: -f1)
printf 'long.c:%d: too_long: 101 lines\nlong.c:%d: same_line: 102 lines\n' \
    $((long_start + 1)) "$same_start" >"$tmp/want"
check "the scanner reports exactly the two functions over $limit lines of a test file" \
    diff "$tmp/want" "$tmp/found"

files=$(find "$srcdir/runtime" "$srcdir/plugins" -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) | sort)
check "the source files to scan are found under $srcdir" test -n "$files"
# shellcheck disable=SC2086 # one word per file; the tree has no spaces in its names
scan $files | sed "s|^$srcdir/||" >"$tmp/offenders"
check "no function in runtime/ or plugins/ is over $limit lines" \
    sh -c "if test -s '$tmp/offenders'; then cat '$tmp/offenders'; exit 1; fi"
echo "$pass passed, $fail failed"
test "$fail" -eq 0
