#!/bin/sh
# test-docs.sh - what docs/user-guide.md promises a reader about files: every source-tree path
# it names exists, and the example plugin it tells installed users to copy is installed and
# compiles against the public headers warning-free. Run by make check.
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
echo "$pass passed, $fail failed"
test "$fail" -eq 0
