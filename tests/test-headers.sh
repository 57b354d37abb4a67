#!/bin/sh
# test-headers.sh - the public headers as an application or plugin author meets them: each one
# alone and all together compile warning-free as strict C11 and as C++11 (so no header depends
# on another being included first, and none makes user code warn under -Wpedantic), the
# plugin macros expand cleanly, no line is too long to read, and none sends the reader to a
# file that is not installed. Run by make check.
set -u
srcdir=${srcdir:-.}
builddir=${top_builddir:-.}
cc=${BP_TEST_CC:-cc}
cxx=${BP_TEST_CXX:-}
# version.h is generated into the build tree; the others are in the (read-only) source tree.
inc="-I$srcdir/include -I$builddir/include"
cflags="-std=c11 -Wall -Wextra -Wpedantic -Werror"
cxxflags="-std=c++11 -Wall -Wextra -Wpedantic -Werror"
. "$(dirname "$0")/check.sh"
if [ -z "${BP_TEST_HEADERS:-}" ]; then
    echo "FAIL: BP_TEST_HEADERS (the installed headers, set by make check) is empty"
    exit 1
fi
if [ -z "$cxx" ]; then
    fail=$((fail + 1))
    echo "FAIL: no C++ compiler was found by configure (g++ is in tools/build-deps.txt)"
fi
: >"$tmp/all.c"
for h in $BP_TEST_HEADERS; do
    name=${h#include/}
    printf '#include <%s>\n' "$name" >"$tmp/one.c"
    printf '#include <%s>\n' "$name" >>"$tmp/all.c"
    check "$name alone, C11" $cc $cflags $inc -fsyntax-only "$tmp/one.c"
    if [ -n "$cxx" ]; then
        cp "$tmp/one.c" "$tmp/one.cpp"
        check "$name alone, C++11" $cxx $cxxflags $inc -fsyntax-only "$tmp/one.cpp"
    fi
    # A header is all an application or plugin author has: it must not send them to files
    # that are not installed (runtime/ops.c, common/ref.c, ...).
    check "$name refers to no file of the source tree" sh -c "! grep -n -E '(runtime|tests|plugins|tools|bench|docs)/[A-Za-z0-9_-]+[.](c|h|md)' '$srcdir/$h'"
    check "$name has no line over 100 characters" awk 'length > 100 { print FILENAME ":" FNR ": " length " characters"; bad = 1 } END { exit bad }' "$srcdir/$h"
done
check "all headers together, C11" $cc $cflags $inc -fsyntax-only "$tmp/all.c"
if [ -n "$cxx" ]; then
    cp "$tmp/all.c" "$tmp/all.cpp"
    check "all headers together, C++11" $cxx $cxxflags $inc -fsyntax-only "$tmp/all.cpp"
fi
# backplane.h is the whole API but the plugin interface: bp-meta.h's helper must be there.
cat >"$tmp/umbrella.c" <<'C'
#include <backplane/backplane.h>
bp_device *(*meta_new(void))(bp_device *const *, int, bp_meta_split_fn, void *);
bp_device *(*meta_new(void))(bp_device *const *, int, bp_meta_split_fn, void *)
{
    return bp_meta_device_new;
}
C
check "backplane.h includes bp-meta.h" $cc $cflags $inc -fsyntax-only "$tmp/umbrella.c"
# The plugin macros as a plugin uses them.
cat >"$tmp/plugin.c" <<'C'
#include <backplane/bp-plugin.h>
static bp_registry *init(void) { return NULL; }
static int score(void) { return 1; }
BP_PLUGIN_DEFINE("headers", "", BP_CPU_AVX2 | BP_CPU_FMA, init, score);
#define NAME(name, bit, text) text,
static const char *const names[] = {BP_CPU_FEATURE_MAP(NAME)};
#undef NAME
const char *first_feature(void);
const char *first_feature(void) { return names[0]; }
C
check "BP_PLUGIN_DEFINE and BP_CPU_FEATURE_MAP expand cleanly, C11" $cc $cflags $inc -c -o "$tmp/plugin.o" "$tmp/plugin.c"
echo "$pass passed, $fail failed"
test "$fail" -eq 0
