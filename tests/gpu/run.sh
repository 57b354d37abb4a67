#!/bin/sh
# tests/gpu/run.sh - everything that needs a GPU, in one run, for machines that have one (an
# H200 when a session is lent one): builds the tree with the CUDA plugin for sm_90 in
# ./build-gpu, runs the CUDA suites (they must PASS here: a SKIP is reported as a failure,
# since this script only makes sense on a GPU) and the CUDA benchmarks. Sized to finish in
# well under 8 minutes on one H200 with 16 cores.
#
#   tests/gpu/run.sh [OUTDIR]     logs and benchmark output go to OUTDIR (default: $OUT, else
#                                 ./build-gpu/gpu-results)
#
# Needs what tools/build-deps.txt lists and the CUDA toolkit in /usr/local/cuda (or CUDA_HOME);
# it installs nothing (the GPU machine may have no network).
set -u

top=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-${OUT:-$top/build-gpu/gpu-results}}
mkdir -p "$out"
jobs=$(nproc 2>/dev/null || echo 4)
log() { echo "gpu/run.sh: $*" | tee -a "$out/summary.txt"; }
start=$(date +%s)

command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi > "$out/nvidia-smi.txt" 2>&1
cd "$top"
if [ ! -x configure ]; then
    ./bootstrap > "$out/bootstrap.log" 2>&1 || { log "bootstrap failed (autoconf, automake, libtool installed?)"; exit 1; }
fi
mkdir -p build-gpu
cd build-gpu
if [ ! -f Makefile ]; then
    ../configure --with-cuda --with-cuda-arch=sm_90 > "$out/configure.log" 2>&1 ||
        { tail -20 "$out/configure.log"; log "configure failed"; exit 1; }
fi
grep -A12 "^  backplane" "$out/configure.log" 2>/dev/null | tee -a "$out/summary.txt"
make -j"$jobs" > "$out/make.log" 2>&1 || { tail -30 "$out/make.log"; log "build failed"; exit 1; }
log "built in $(( $(date +%s) - start )) s"

status=0
make -j"$jobs" check TESTS="tests/test-cuda-load tests/test-cuda" > "$out/check.log" 2>&1 || status=1
cp tests/test-cuda.log tests/test-cuda-load.log "$out/" 2>/dev/null
for t in test-cuda-load test-cuda; do
    r=$(sed -n 's/^:test-result: //p' "tests/$t.trs" 2>/dev/null)
    log "$t: ${r:-not run}"
    [ "$r" = PASS ] || status=1
done
grep -h "Checks:" tests/test-cuda.log tests/test-cuda-load.log 2>/dev/null | tee -a "$out/summary.txt"

export BP_LOG_LEVEL=error
timeout 120 ./bench/bench-matmul --device CUDA0 --min-time 1 > "$out/bench-matmul-cuda.txt" 2>&1 ||
    log "bench-matmul --device CUDA0 failed or timed out"
timeout 60 ./bench/bench-ops --device CUDA0 --min-time 1 > "$out/bench-ops-cuda.txt" 2>&1 ||
    log "bench-ops --device CUDA0 failed or timed out"
cat "$out/bench-matmul-cuda.txt" "$out/bench-ops-cuda.txt" | tee -a "$out/summary.txt"
log "finished in $(( $(date +%s) - start )) s, status $status"
exit $status
