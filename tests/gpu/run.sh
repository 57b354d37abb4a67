#!/bin/sh
# tests/gpu/run.sh [FOLDER] - everything that needs a GPU, in one run, on a machine with the
# NVIDIA driver and CUDA but nothing else of ours: no compiler, autotools, Check or network.
# FOLDER (default ./gpu-pack) is what tests/gpu/prepare.sh built on a development machine;
# docs/cuda.md says how to carry it to the GPU machine and launch this.
#
#   1. preflight: nvidia-smi, every program and plugin resolves its libraries (ldd), cuBLAS and
#      NCCL found; without NCCL the plugin built --without-nccl is used, and the summary says so
#   2. test-cuda-load, then test-cuda (the whole conformance suite on CUDA0, buffers, events,
#      the scheduler, Meta(CUDA0), NCCL on one GPU); on a GPU a skip counts as a failure
#   3. backplane run --model small --check -d CUDA0,CPU for every weight type
#   4. bench-matmul --device CUDA0 (against cuBLAS doing the same GEMMs), bench-matmul --device
#      CUDA0 --quant (the matrix-vector product M=4096 K=4096 N=1 of every quantised weight type
#      against Q4_0's, a Markdown table for docs/performance.md) and bench-ops --device CUDA0
#      (against cudaMemcpy)
#
# Everything goes under $OUT (else FOLDER/results): run.log with every command's output, and
# summary.txt (only those two and nvidia-smi.txt: the device tool returns few files). Sized to
# finish in under 6 minutes on one H200, so a rerun fits a 15-minute lease: the whole run keeps
# to a deadline of GPU_RUN_BUDGET seconds (default 360), each step limited to what is left of
# it, so that it ends with its summary before the caller's timeout kills it.
# Exit status: 0 all passed, 1 something failed, 77 no GPU here (steps 2-4 skipped).
set -u

top=$(cd "$(dirname "$0")/../.." && pwd)
pack=${1:-$top/gpu-pack}
case "$pack" in /*) ;; *) pack=$(pwd)/$pack ;; esac
out=${OUT:-$pack/results}
mkdir -p "$out"
summary=$out/summary.txt
log=$out/run.log
: > "$summary"
: > "$log"
start=$(date +%s)
deadline=$((start + ${GPU_RUN_BUDGET:-360}))
status=0
tmp=$(mktemp -d "${TMPDIR:-/tmp}/bp-gpu-run.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

say() { echo "$*" | tee -a "$summary"; }
fail() { say "FAIL: $*"; status=1; }
# step NAME SECONDS COMMAND...: runs it with a time limit (SECONDS, or what is left before the
# deadline if that is less), its output in the log; 124 when it ran out of time, and 125
# without running when too little time is left.
step() {
    name=$1
    limit=$2
    shift 2
    left=$((deadline - $(date +%s)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then
        echo "=== $name: not run: the run's deadline has passed" >> "$log"
        return 125
    fi
    echo "=== $name: $*" >> "$log"
    t0=$(date +%s)
    timeout "$limit" "$@" >> "$log" 2>&1
    rc=$?
    echo "=== $name: exit $rc after $(($(date +%s) - t0)) s" >> "$log"
    return $rc
}
# The output of step NAME in the log.
output_of() { sed -n "/^=== $1: /,/^=== $1: exit/p" "$log" | grep -v '^==='; }

if [ ! -x "$pack/bin/test-cuda" ]; then
    say "FAIL: no prepared folder at $pack (run tests/gpu/prepare.sh there, carry the folder)"
    exit 1
fi
say "gpu/run.sh: $(date -u '+%Y-%m-%d %H:%M UTC') on $(hostname 2>/dev/null || echo '?'), $(nproc 2>/dev/null || echo '?') cores"
sed 's/^/  /' "$pack/BUILD-INFO" | tee -a "$summary"

# ---- 1. preflight ----------------------------------------------------------------------------
# The folder's libraries, then CUDA's where the toolkit or pip's nvidia packages put them (the
# dynamic loader's cache may know neither).
libs=$pack/lib
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/lib64 \
    $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
    case "$d" in
    *-packages) for n in "$d"/nvidia/*/lib; do [ -d "$n" ] && libs=$libs:$n; done ;;
    *) [ -d "$d" ] && libs=$libs:$d ;;
    esac
done
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$log"
plugins=$pack/plugins
gpu=yes
if ! command -v nvidia-smi > /dev/null 2>&1; then
    say "preflight: no nvidia-smi: no NVIDIA driver on this machine"
    gpu=no
elif ! nvidia-smi > "$out/nvidia-smi.txt" 2>&1; then
    say "preflight: nvidia-smi failed: $(head -n 1 "$out/nvidia-smi.txt")"
    gpu=no
else
    say "preflight: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
fi
# Libraries FILE cannot find, and those found in a version too old for it ("version `X' not
# found (required by Y)"), as one line.
missing() {
    ldd "$1" 2>&1 | sed -n -e 's/^[[:space:]]*\([^ ]*\) => not found$/\1/p' \
        -e "s/^.*: \(version \`[^']*' not found\).*(required by \([^)]*\)).*/\1 for \2/p" |
        sort -u | tr '\n' ' '
}
for f in "$pack"/bin/*; do
    m=$(missing "$f")
    [ -z "$m" ] || fail "preflight: $(basename "$f") cannot find $m"
done
m=$(missing "$plugins/libbackplane-cuda-impl.so")
nccl=$(sed -n 's/^nccl: //p' "$pack/BUILD-INFO")
case "$m" in
"") if [ "$nccl" = yes ]; then say "preflight: cudart, cuBLAS and NCCL found"
    else say "preflight: cudart and cuBLAS found; this folder was built without NCCL: the collectives are NOT tested in this run"; fi ;;
*libcudart* | *libcublas*)
    fail "preflight: the CUDA plugin cannot find $m(this folder was built with the toolkit in BUILD-INFO; install that CUDA major version)" ;;
*libnccl*)
    if [ -z "$(missing "$pack/plugins-nonccl/libbackplane-cuda-impl.so")" ]; then
        say "preflight: NCCL not found ($m): using the plugin built --without-nccl; the collectives are NOT tested in this run"
        mkdir -p "$tmp/plugins"
        cp "$pack"/plugins/backplane-cpu-*.so "$pack"/plugins/backplane-meta.so \
            "$pack"/plugins-nonccl/*.so "$tmp/plugins/"
        plugins=$tmp/plugins
    else
        fail "preflight: neither CUDA plugin resolves its libraries: $m"
    fi ;;
*) fail "preflight: the CUDA plugin cannot find $m" ;;
esac

export BP_LOG_LEVEL=error CK_DEFAULT_TIMEOUT=120
export BP_TEST_CUDA_PLUGIN_DIR="$plugins" BP_TEST_CPU_PLUGIN_DIR="$plugins"
export BP_TEST_META_PLUGIN_DIR="$plugins" BP_PLUGIN_PATH="$plugins" BP_PLUGIN_SYSTEM_PATH=
unset BP_PLUGINS_ONLY BP_PLUGINS_DISABLE BP_CPU_DISABLE BP_PLUGIN_PROBE BP_PLUGIN_PROBE_CACHE

# ---- 2. test suites ----------------------------------------------------------------------------
# test-cuda-load runs on any machine; test-cuda exits 77 without a GPU.
for t in test-cuda-load test-cuda; do
    step "$t" 150 "$pack/bin/$t"
    rc=$?
    checks=$(output_of "$t" | grep -E '^[0-9]+%: Checks' | tail -n 1)
    case "$rc" in
    0) say "PASS: $t ${checks:+($checks)}" ;;
    77) if [ "$gpu" = yes ]; then fail "$t skipped on a machine with a GPU"; else say "SKIP: $t (no GPU)"; fi ;;
    124) fail "$t ran out of time" ;;
    125) fail "$t not run: out of time" ;;
    *) fail "$t exit $rc ${checks:+($checks)}"
       output_of "$t" | grep -E ':[FE]:' | head -n 20 | sed 's/^/  /' | tee -a "$summary" ;;
    esac
done

if [ "$gpu" = no ]; then
    say "no GPU: the model runs and benchmarks are skipped ($(($(date +%s) - start)) s)"
    [ "$status" = 0 ] && exit 77
    exit "$status"
fi

# ---- 3. whole models, CUDA0 and the CPU against the CPU alone -----------------------------------
# --check judges the logits by the weight type's NMSE bound (a near tie may change a token where
# the CPU quantises activations to Q8_0 and CUDA does not).
for w in f32 f16 bf16 q8_0 q4_0; do
    if step "run-$w" 60 "$pack/bin/backplane" run --model small --wtype "$w" -d CUDA0,CPU --check; then
        say "PASS: run --model small --wtype $w -d CUDA0,CPU --check: $(output_of "run-$w" | grep '^check:' | tail -n 1)"
    else
        fail "run --model small --wtype $w -d CUDA0,CPU --check"
        output_of "run-$w" | tail -n 5 | sed 's/^/  /' | tee -a "$summary"
    fi
done

# ---- 4. benchmarks -------------------------------------------------------------------------------
step bench-matmul 90 "$pack/bin/bench-matmul" --device CUDA0 --min-time 0.3 ||
    fail "bench-matmul --device CUDA0"
step bench-quant 40 "$pack/bin/bench-matmul" --device CUDA0 --quant --M 4096 --K 4096 --N 1 \
    --min-time 0.2 || fail "bench-matmul --device CUDA0 --quant"
step bench-ops 60 "$pack/bin/bench-ops" --device CUDA0 --min-time 0.3 ||
    fail "bench-ops --device CUDA0"
for b in bench-matmul bench-quant bench-ops; do
    output_of "$b" | sed 's/^/  /' | tee -a "$summary"
done

say "finished in $(($(date +%s) - start)) s, status $status"
exit "$status"
