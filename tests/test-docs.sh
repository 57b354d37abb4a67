#!/bin/sh
# test-docs.sh - what docs/user-guide.md promises a reader about files: every source-tree path
# it names exists, and the example plugin it tells installed users to copy is installed and
# compiles against the public headers warning-free; and the environment tables of README.md and
# of the guide name every variable the code reads, and no other. Run by make check.
set -u
srcdir=${srcdir:-.}
builddir=${top_builddir:-.}
cc=${BP_TEST_CC:-cc}
. "$(dirname "$0")/check.sh"
guide="$srcdir/docs/user-guide.md"
# Paths into the source tree; templates such as tests/test-conformance-<name>.c are left out.
grep -o '\(docs\|examples\|tests\|tools\|plugins\|include\|bench\|runtime\)/[A-Za-z0-9_./<>-]*' \
    "$guide" | grep -v '<' | sed 's/[.]*$//' | sort -u >"$tmp/paths"
check "the guide names source-tree paths" test -s "$tmp/paths"
while read -r p; do
    check "docs/user-guide.md names $p, which exists" test -e "$srcdir/$p"
done <"$tmp/paths"
# The example plugin is installed where the guide says, and builds from there.
check "make install puts the example plugin under \$(docdir)/examples" sh -c "
    ${MAKE:-make} -s -C '$builddir' install-dist_exampleDATA DESTDIR='$tmp/dest' &&
    find '$tmp/dest' -path '*/share/doc/backplane/examples/example-plugin.c' | grep -q ."
check "the example plugin compiles with -Wpedantic against the public headers" \
    $cc -std=c11 -Wall -Wextra -Wpedantic -Werror -I"$srcdir/include" -I"$builddir/include" \
    -fsyntax-only "$srcdir/examples/example-plugin.c"
check "make install puts the asynchronous example plugin beside it" sh -c \
    "find '$tmp/dest' -path '*/share/doc/backplane/examples/example-async-plugin.c' | grep -q ."
check "the asynchronous example plugin compiles with -Wpedantic against the public headers" \
    $cc -std=c11 -Wall -Wextra -Wpedantic -Werror -I"$srcdir/include" -I"$builddir/include" \
    -fsyntax-only "$srcdir/examples/example-async-plugin.c"
# The environment tables of README.md and of the user guide name exactly the BP_* variables
# the library, the plugins and the tool read (getenv or secure_getenv with the name written out,
# as all of them are).
find "$srcdir/runtime" "$srcdir/plugins" "$srcdir/tools" -type f \
    \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) -exec cat {} + |
    grep -oE 'getenv\("BP_[A-Z0-9_]+"' | grep -oE 'BP_[A-Z0-9_]+' | sort -u >"$tmp/env-code"
check "the code reads BP_* variables (BP_PLUGIN_PATH among them)" grep -qx BP_PLUGIN_PATH "$tmp/env-code"
env_table() { # file: its "## Environment..." section's table against the code
    sed -n '/^## Environment/,/^## /p' "$srcdir/$1" | grep '^| `' | cut -d'|' -f2 |
        grep -oE 'BP_[A-Z0-9_]+' | sort -u >"$tmp/env-doc"
    comm -23 "$tmp/env-code" "$tmp/env-doc" | sed "s|^|read by the code, not in $1's table: |"
    comm -13 "$tmp/env-code" "$tmp/env-doc" | sed "s|^|in $1's table, read by no code: |"
    cmp -s "$tmp/env-code" "$tmp/env-doc"
}
for doc in README.md docs/user-guide.md; do
    check "$doc's environment table lists exactly the variables the code reads" env_table "$doc"
done
echo "$pass passed, $fail failed"
test "$fail" -eq 0
