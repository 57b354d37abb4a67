#!/bin/sh
# tests/fuzz/run.sh - builds the runtime and plugins with clang's libFuzzer instrumentation plus
# ASan and UBSan in ./build-fuzz, then runs each target of tests/fuzz for a bounded time on its
# corpus (the seeds here, plus real plugin files from the build for the loader) and prints one
# line per target: executions, crashes (must be 0). tools/dev.sh check runs it.
#
#   tests/fuzz/run.sh [SECONDS]    seconds per target at most (default 60)
#
# BP_FUZZ_SEED (default 1) and BP_FUZZ_RUNS (default 120,000 graphs, 40,000 loader inputs,
# 300,000 GGUF files) fix the inputs tried, so a run is repeatable; set another seed for a fresh campaign.
#
# Exits 77 when clang or its libFuzzer runtime (Debian: clang, libclang-rt-14-dev) is missing.
set -u
secs=${1:-60}
top=$(cd "$(dirname "$0")/../.." && pwd)
command -v clang >/dev/null 2>&1 || { echo "SKIP: clang is not installed"; exit 77; }
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; return (int)n * 0; }' \
    > /tmp/bp-fuzz-probe.c
clang -fsanitize=fuzzer /tmp/bp-fuzz-probe.c -o /tmp/bp-fuzz-probe >/dev/null 2>&1 ||
    { rm -f /tmp/bp-fuzz-probe.c; echo "SKIP: clang has no libFuzzer runtime (libclang-rt-14-dev)"; exit 77; }
rm -f /tmp/bp-fuzz-probe.c /tmp/bp-fuzz-probe
san="-fsanitize=address,undefined -fno-sanitize-recover=all"
b="$top/build-fuzz"
mkdir -p "$b"
cd "$b" || exit 1
if [ ! -f Makefile ] || [ "$top/configure" -nt Makefile ]; then
    "$top/configure" CC=clang CFLAGS="-g -O1 -fsanitize=fuzzer-no-link $san" LDFLAGS="$san" \
        --without-cuda --disable-cpu-variants > configure.log 2>&1 ||
        { tail -20 configure.log; exit 1; }
fi
make -j"$(nproc)" > make.log 2>&1 || { tail -30 make.log; exit 1; }
make -j"$(nproc)" tests/accel/backplane-accel.la > /dev/null 2>&1 || exit 1
inc="-I$top/include -I$b/include -I$b"
for t in fuzz-graph fuzz-loader fuzz-gguf; do
    extra=""
    [ "$t" = fuzz-graph ] && extra="$top/common/ref.c"
    clang -g -O1 -fsanitize=fuzzer $san $inc "$top/tests/fuzz/$t.c" $extra -L"$b/.libs" \
        -lbackplane -Wl,-rpath,"$b/.libs" -lm -o "$b/$t" || exit 1
done

export BP_FUZZ_CPU_DIR="$b/plugins/cpu/.libs" BP_FUZZ_ACCEL_DIR="$b/tests/accel/.libs"
export BP_PLUGIN_PATH= BP_PLUGIN_SYSTEM_PATH=
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
status=0
for t in fuzz-graph fuzz-loader fuzz-gguf; do
    corpus="$b/corpus-$t"
    rm -rf "$corpus"
    mkdir -p "$corpus"
    cp "$top/tests/fuzz/corpus-${t#fuzz-}"/* "$corpus/"
    if [ "$t" = fuzz-loader ]; then
        # Real plugins as seeds (mode byte 0: a file), from the ordinary build: libFuzzer keeps
        # reading the coverage counters of every instrumented module it has seen, so a plugin of
        # this build that is loaded and unloaded again would crash it (a libFuzzer limitation,
        # not a finding). Without an ordinary build only the small seeds are used.
        for so in "$top/build/plugins/meta/.libs/backplane-meta.so" \
                  "$top/build/plugins/cpu/.libs/backplane-cpu-x86_64.so"; do
            [ -f "$so" ] && { printf '\000'; cat "$so"; } > "$corpus/plugin-$(basename "$so")"
        done
    fi
    [ "$t" = fuzz-gguf ] && cp "$top/tests/gguf/reference.gguf" "$corpus/"
    mkdir -p "$b/crashes-$t" "$b/findings-$t"
    rm -f "$b/findings-$t"/*
    export BP_FUZZ_FINDINGS="$b/findings-$t"
    # A fixed seed and a fixed number of runs make a run repeatable: what CI finds, the same
    # command finds here (the time limit only cuts the same sequence short on a slow machine).
    runs=120000
    [ "$t" = fuzz-loader ] && runs=40000
    [ "$t" = fuzz-gguf ] && runs=300000
    run_target() {
        "$b/$t" -seed="${BP_FUZZ_SEED:-1}" -runs="${BP_FUZZ_RUNS:-$runs}" -max_total_time="$secs" \
            -print_final_stats=1 -artifact_prefix="$b/crashes-$t/" -max_len=400000 -timeout=30 \
            "$corpus" > "$b/$t.log" 2>&1
    }
    run_target
    rc=$?
    # fuzz-loader runs mutated plugin code in this process: once in several runs the process
    # has died of a signal inside the sanitizer's own handler, with no crash input saved, and
    # the same seed then ran clean (an open problem, docs/reliability.md). Such a death is
    # reported here in full and the target run once more; a second failure fails the run.
    if [ "$rc" -ge 128 ] && [ "$(find "$b/crashes-$t" -type f | wc -l)" -eq 0 ]; then
        echo "fuzz $t: died with exit $rc and saved no crash input; its log:"
        grep -B2 -A12 -m1 "DEADLYSIGNAL\|==ERROR" "$b/$t.log" | head -20
        cp "$b/$t.log" "$b/$t.first.log"
        echo "fuzz $t: running it once more with the same seed"
        run_target
        rc=$?
    fi
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$b/$t.log")
    crashes=$(find "$b/crashes-$t" -type f | wc -l)
    findings=$(find "$b/findings-$t" -type f | wc -l)
    echo "fuzz $t: ${execs:-0} executions (seed ${BP_FUZZ_SEED:-1}, at most ${secs} s), $crashes crashes (exit $rc), $findings wrong results"
    # A wrong result is reported with its input and graph, for a person to look at (it may be a
    # numerically ill-conditioned graph the tolerance does not cover); it does not fail the run.
    [ "$findings" -gt 0 ] && grep -A14 "NMSE" "$b/$t.log" | head -40 && ls "$b/findings-$t"
    grep "results compared" "$b/$t.log" | tail -1 | sed 's/^/fuzz   /'
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        grep -A25 -m1 "ERROR\|==ERROR\|runtime error\|deadly signal" "$b/$t.log" | head -40
        status=1
    fi
done
exit $status
