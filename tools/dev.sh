#!/bin/sh
# dev.sh - build backplane from a git checkout on a Debian machine, installing what is missing.
#
#   tools/dev.sh run     build everything, then run the main job: `backplane list` and
#                        `backplane run --model tiny --check`
#   tools/dev.sh check   build everything, run `make check` (again under valgrind for some
#                        suites, and from an ASan+UBSan build), `make distcheck` and, as root,
#                        build and install the Debian packages (tests/packaging.sh)
#
# Builds out of tree in ./build with warnings as errors. BP_CONFIGURE_FLAGS adds configure flags.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=${BP_JOBS:-$(nproc 2>/dev/null || echo 2)}

install_deps() {
    missing=""
    for p in $(grep -v '^#' tools/build-deps.txt); do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    echo "dev.sh: installing build dependencies:$missing"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo=sudo
    $sudo apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
}

build() {
    install_deps
    [ -x configure ] && [ configure -nt configure.ac ] && [ configure -nt Makefile.am ] || ./bootstrap
    mkdir -p build
    cd build
    if [ ! -f Makefile ] || [ ../configure -nt Makefile ]; then
        # shellcheck disable=SC2086
        ../configure --enable-werror ${BP_CONFIGURE_FLAGS:-}
    fi
    make -j"$jobs"
}

# The summary lines of each suite (Check's, or a script's "N passed, M failed"), then a total.
summarize() {
    for log in tests/*.log; do
        grep -E '^[0-9]+%: Checks: |^[0-9]+ passed, [0-9]+ failed$' "$log" |
            sed "s|^\([0-9]* passed\)|$(basename "$log" .log): \1|"
    done | awk '
        { print }
        /Checks: / { n = $3 + 0; f = $5 + 0; e = $7 + 0; total += n; failed += f + e }
        / passed, / { total += $2 + $4; failed += $4 }
        END { printf "checks: %d passed, %d failed\n", total - failed, failed }'
    grep -h '^SKIP: ' tests/packaging.log 2>/dev/null | sed 's/^SKIP: /skipped: packaging: /'
    # Suites that skipped (exit 77, e.g. the GPU suite without a GPU) are named, never counted.
    for trs in tests/*.trs; do
        grep -q '^:test-result: SKIP' "$trs" 2>/dev/null || continue
        log="${trs%.trs}.log"
        echo "skipped: $(basename "$log" .log): $(grep -m1 '^SKIP: ' "$log" | sed 's/^SKIP: //')"
    done
}

case "${1:-}" in
run)
    build
    # Run against the plugins just built (nothing is installed).
    BP_PLUGIN_PATH="$(pwd)/plugins/cpu/.libs:$(pwd)/plugins/meta/.libs${BP_PLUGIN_PATH:+:$BP_PLUGIN_PATH}"
    [ -d plugins/cuda/.libs ] && BP_PLUGIN_PATH="$(pwd)/plugins/cuda/.libs:$BP_PLUGIN_PATH"
    export BP_PLUGIN_PATH
    ./tools/backplane version
    ./tools/backplane list
    # The main job: the tiny model on the best devices here, checked against the CPU alone.
    echo
    echo '$ backplane run --model tiny --check'
    ./tools/backplane run --model tiny --check
    ;;
check)
    build
    status=0
    make -j"$jobs" check || status=$?
    if [ "$status" -ne 0 ]; then
        cat test-suite.log
        summarize
        exit "$status"
    fi
    # The loader, scheduler, meta and CPU-plugin suites once more under valgrind memcheck: any
    # error or definite/indirect leak fails the run. (Valgrind's CPU has no AVX-512, so the CPU
    # suite runs the avx2 and baseline variants' kernels here; ASan below runs the avx512 ones.)
    if command -v valgrind >/dev/null 2>&1; then
        make -j"$jobs" check TESTS="tests/test-loader tests/test-sched tests/test-meta tests/test-cpu" \
            LOG_COMPILER="$(pwd)/libtool --mode=execute valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect" ||
            { cat test-suite.log; exit 1; }
        echo "valgrind: tests/test-loader, tests/test-sched, tests/test-meta and tests/test-cpu clean"
    fi
    # The whole suite once more from an AddressSanitizer + UndefinedBehaviorSanitizer build in
    # ../build-asan: any report (including a leak) fails the run. BP_CHECK_SANITIZE=0 skips it.
    if [ "${BP_CHECK_SANITIZE:-1}" != 0 ]; then
        mkdir -p ../build-asan
        (cd ../build-asan &&
            { [ -f Makefile ] && [ ../configure -ot Makefile ] ||
                ../configure --enable-werror --enable-sanitizers CFLAGS="-g -O1"; } &&
            make -j"$jobs" >/dev/null &&
            ASAN_OPTIONS=detect_leaks=1 make -j"$jobs" check) ||
            { cat ../build-asan/test-suite.log 2>/dev/null; exit 1; }
        echo "sanitizers: make check clean under ASan+UBSan (build-asan)"
    fi
    # The threaded suites once more from a ThreadSanitizer build in ../build-tsan: two threads
    # with their own backends over shared weights, the scheduler's pipelined evaluations, the
    # meta backend's worker threads, the asynchronous example plugin's workers and events. Any
    # report fails the run. BP_CHECK_SANITIZE=0 skips it.
    if [ "${BP_CHECK_SANITIZE:-1}" != 0 ]; then
        mkdir -p ../build-tsan
        (cd ../build-tsan &&
            { [ -f Makefile ] && [ ../configure -ot Makefile ] ||
                ../configure --enable-werror --enable-tsan --without-cuda CFLAGS="-g -O1"; } &&
            make -j"$jobs" >/dev/null &&
            TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" make -j"$jobs" check \
                TESTS="tests/test-threads tests/test-sched tests/test-meta tests/test-async") ||
            { cat ../build-tsan/test-suite.log 2>/dev/null; exit 1; }
        echo "sanitizers: test-threads, test-sched, test-meta, test-async clean under TSan (build-tsan)"
    fi
    # Fuzzing (tests/fuzz): random scheduled graphs against the reference, plugin files and
    # hostile names, BP_FUZZ_SECONDS (default 60) per target; any crash fails the run.
    fstatus=0
    sh ../tests/fuzz/run.sh "${BP_FUZZ_SECONDS:-60}" > tests/fuzz.log 2>&1 || fstatus=$?
    if [ "$fstatus" -eq 77 ]; then
        echo "fuzz: $(grep -m1 '^SKIP: ' tests/fuzz.log)"
    elif [ "$fstatus" -ne 0 ]; then
        cat tests/fuzz.log
        exit 1
    fi
    grep '^fuzz ' tests/fuzz.log
    make -j"$jobs" distcheck
    # The Debian packages from the tarball distcheck just made, installed and removed for real
    # (root only; tests/packaging.sh skips with exit 77 otherwise).
    pstatus=0
    sh ../tests/packaging.sh "backplane-$(sed -n 's/^PACKAGE_VERSION = //p' Makefile).tar.gz" \
        > tests/packaging.log 2>&1 || pstatus=$?
    if [ "$pstatus" -eq 77 ]; then
        echo "packaging: $(grep -m1 '^SKIP: ' tests/packaging.log)"
    elif [ "$pstatus" -ne 0 ]; then
        cat tests/packaging.log
        summarize
        exit 1
    fi
    # The GPU run's folder (tests/gpu): prepared, moved elsewhere, and run.sh's preflight and
    # tests executed from there. Without a GPU it must end in its no-GPU skip (77) with
    # test-cuda-load passed; on a GPU machine everything must pass (0).
    if grep -q '^CUDA_LIBS = .*-lcudart' Makefile; then
        gdir=$(mktemp -d)
        gstatus=0
        { sh "$top/tests/gpu/prepare.sh" "$gdir/pack" && mv "$gdir/pack" "$gdir/moved" &&
            (cd / && OUT="$gdir/out" sh "$top/tests/gpu/run.sh" "$gdir/moved"); } \
            > tests/gpu-pack.log 2>&1 || gstatus=$?
        if [ "$gstatus" -ne 0 ] && [ "$gstatus" -ne 77 ]; then
            cat tests/gpu-pack.log
            rm -rf "$gdir"
            exit 1
        fi
        echo "gpu pack: prepared ($(sed -n 's/^size: //p' "$gdir/moved/BUILD-INFO")), relocated, run.sh exit $gstatus: $(grep -c '^PASS' "$gdir/out/summary.txt") passed, $(grep -c '^SKIP' "$gdir/out/summary.txt") skipped"
        rm -rf "$gdir"
    fi
    summarize
    ;;
*)
    echo "usage: tools/dev.sh run|check" >&2
    exit 2
    ;;
esac
