#!/usr/bin/env python3
"""bench/ggml-peer.py - MUL_MAT in ggml (llama.cpp's build, through the libraries that
`pip install llama-cpp-python` ships) against bench-matmul, in interleaved pairs on the same
shapes and thread counts. Benchmark runs only: never CI, never the library.

  ggml-peer.py [--types bf16,f16,q8_0,q4_0|all] [--shapes 4096x4096x512,...] [--threads 2]
               [--pairs 5] [--min-time 0.5] [--bench-matmul ./bench/bench-matmul] [--half]
               [--ggml-lib DIR --disable FEATURES [--no-ggml-repack]]

A shape is MxKxN (weights M rows of K, N activation columns). Each pair times ggml, then
bench-matmul (`--no-limits`, same type, shape and threads); the line printed per case gives both
medians and the median of the per-pair ratios (backplane / ggml). Weights are placed the way
llama.cpp places them: in the first of ggml's extra CPU buffer types (AMX where ggml was built
for it and the CPU has it, then CPU_REPACK) whose device says it takes the product there (the
test llama.cpp makes; on x86 with AVX2 this ggml repacks Q4_0, Q4_K, IQ4_NL and, with AVX-512,
Q2_K; its AMX buffer takes Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K and IQ4_XS), else in the plain
CPU buffer; ours are repacked for Q4_0, Q8_0,
IQ4_NL, Q5_0, Q4_1, Q5_1, Q4_K, Q5_K and IQ4_XS (q4_0_repack, ...) and used as they are for the
other types. --types all: every type below but f32. ggml's F16/BF16
products convert the activations to the weights' 16-bit type (its vec_dot_type), ours keep them
in f32 (docs/decisions.md), so equal speed means more work done here; --half gives ours the
same permission (BP_MM_PRECISION_HALF: bench-matmul's bf16_half and f16_half).

On some AMX machines ggml's AMX kernels fault (llama-bench and llama-cli crash there too, in
ggml_backend_amx_mul_mat), so the llama.cpp that works on them is one built without AMX: the
same cmake line as the peer's with -DCMAKE_C_FLAGS and -DCMAKE_CXX_FLAGS set to
"-mno-amx-tile -mno-amx-int8 -mno-amx-bf16", passed with --ggml-lib (docs/performance.md).

Other instruction-set levels: build ggml for that level (cmake -DGGML_NATIVE=OFF with its
GGML_AVX2/... switches) and pass its library directory with --ggml-lib, and our plugin's variant of
the same level with --disable (BP_CPU_DISABLE).
"""
import argparse
import ctypes
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np

# --ggml-lib DIR (read before any library loads): another ggml build's libggml*.so, e.g. one
# built for AVX2 only or the x86-64 baseline to compare with our variant of the same level. The
# llama_cpp package is then not imported at all: it would load its own libggml-cpu.so.0 first,
# and the dynamic linker would hand that same soname to the other build's libggml.so.
LIB = None
for _i, _a in enumerate(sys.argv):
    if _a == "--ggml-lib" and _i + 1 < len(sys.argv):
        LIB = sys.argv[_i + 1]
if LIB is None:
    try:
        import importlib.util
        _spec = importlib.util.find_spec("llama_cpp")
    except ImportError:
        _spec = None
    if _spec is None or _spec.origin is None:
        sys.exit("ggml-peer.py: llama_cpp is not installed (pip install llama-cpp-python)")
    LIB = os.path.join(os.path.dirname(_spec.origin), "lib")
base = ctypes.CDLL(os.path.join(LIB, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
ggml = ctypes.CDLL(os.path.join(LIB, "libggml.so"), mode=ctypes.RTLD_GLOBAL)
cpu = ctypes.CDLL(os.path.join(LIB, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)

GGML_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
              "q2_K": 10, "q3_K": 11, "q4_K": 12, "q5_K": 13, "q6_K": 14, "iq4_nl": 20,
              "iq4_xs": 23, "bf16": 30}


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


P, I64, SZ = ctypes.c_void_p, ctypes.c_int64, ctypes.c_size_t


def sig(lib, name, res, *args):
    f = getattr(lib, name)
    f.restype = res
    f.argtypes = list(args)
    return f


ggml_init = sig(base, "ggml_init", P, InitParams)
ggml_free = sig(base, "ggml_free", None, P)
new_tensor_2d = sig(base, "ggml_new_tensor_2d", P, P, ctypes.c_int, I64, I64)
mul_mat = sig(base, "ggml_mul_mat", P, P, P, P)
new_graph = sig(base, "ggml_new_graph", P, P)
build_forward = sig(base, "ggml_build_forward_expand", None, P, P)
tensor_overhead = sig(base, "ggml_tensor_overhead", SZ)
graph_overhead = sig(base, "ggml_graph_overhead", SZ)
alloc_tensors = sig(base, "ggml_backend_alloc_ctx_tensors_from_buft", P, P, P)
buffer_free = sig(base, "ggml_backend_buffer_free", None, P)
tensor_set = sig(base, "ggml_backend_tensor_set", None, P, P, SZ, SZ)
graph_compute = sig(base, "ggml_backend_graph_compute", ctypes.c_int, P, P)
backend_free = sig(base, "ggml_backend_free", None, P)
buft_name = sig(base, "ggml_backend_buft_name", ctypes.c_char_p, P)
cpu_buft = sig(base, "ggml_backend_cpu_buffer_type", P)
dev_backend_reg = sig(base, "ggml_backend_dev_backend_reg", P, P)
reg_proc = sig(base, "ggml_backend_reg_get_proc_address", P, P, ctypes.c_char_p)
quantize_chunk = sig(base, "ggml_quantize_chunk", SZ, ctypes.c_int, P, P, I64, I64, I64, P)
fp32_to_fp16 = sig(base, "ggml_fp32_to_fp16_row", None, P, P, I64)
fp32_to_bf16 = sig(base, "ggml_fp32_to_bf16_row", None, P, P, I64)
buft_alloc = sig(base, "ggml_backend_buft_alloc_buffer", P, P, SZ)
dev_supports_op = sig(base, "ggml_backend_dev_supports_op", ctypes.c_bool, P, P)
dev_by_type = sig(ggml, "ggml_backend_dev_by_type", P, ctypes.c_int)
cpu_init = sig(cpu, "ggml_backend_cpu_init", P)
cpu_threads = sig(cpu, "ggml_backend_cpu_set_n_threads", None, P, ctypes.c_int)


def extra_bufts():
    """ggml's CPU extra buffer types (AMX, CPU_REPACK, ...) in the order that llama.cpp tries
    them for a weight."""
    dev = dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    fn = reg_proc(dev_backend_reg(dev), b"ggml_backend_dev_get_extra_bufts")
    if not fn:
        return []
    get = ctypes.CFUNCTYPE(ctypes.POINTER(P), P)(fn)
    arr = get(dev)
    out, i = [], 0
    while arr and arr[i]:
        out.append(arr[i])
        i += 1
    return out


def repack_takes(rb, w, op):
    """Whether ggml's CPU device computes `op` with its weights `w` in the buffer type `rb`: the
    test llama.cpp makes before placing a weight there (a zero-size buffer of that type set on
    the tensor, then the device's supports_op)."""
    buf = buft_alloc(rb, 0)
    if not buf:
        return False
    slot = ctypes.c_void_p.from_address(w + 8)  # struct ggml_tensor: type, then buffer
    slot.value = buf
    ok = dev_supports_op(dev_by_type(0), op)
    slot.value = None
    buffer_free(buf)
    return bool(ok)


def weight_bytes(wtype, M, K, rng):
    x = rng.standard_normal((M, K), dtype=np.float32) * 0.05
    t = GGML_TYPES[wtype]
    if wtype == "f32":
        return x.tobytes()
    if wtype in ("f16", "bf16"):
        out = np.empty(M * K, dtype=np.uint16)
        (fp32_to_fp16 if wtype == "f16" else fp32_to_bf16)(x.ctypes.data, out.ctypes.data, M * K)
        return out.tobytes()
    out = np.empty(M * K * 2, dtype=np.uint8)  # more than any block type needs
    n = quantize_chunk(t, x.ctypes.data, out.ctypes.data, 0, M, K, None)
    return out[:n].tobytes()


def time_ggml(wtype, M, K, N, threads, min_time, use_repack):
    """Median seconds of one ggml MUL_MAT [K, M] x [K, N] on the CPU backend."""
    rng = np.random.default_rng(1)
    meta = InitParams(tensor_overhead() * 8 + graph_overhead(), None, True)
    wctx, actx = ggml_init(meta), ggml_init(meta)
    w = new_tensor_2d(wctx, GGML_TYPES[wtype], K, M)
    b = new_tensor_2d(actx, GGML_TYPES["f32"], K, N)
    out = mul_mat(actx, w, b)
    graph = new_graph(actx)
    build_forward(graph, out)
    rb = None
    for cand in extra_bufts() if use_repack else []:
        if repack_takes(cand, w, out):
            rb = cand
            break
    wbuf = alloc_tensors(wctx, rb or cpu_buft())
    abuf = alloc_tensors(actx, cpu_buft())
    data = weight_bytes(wtype, M, K, rng)
    tensor_set(w, data, 0, len(data))
    xb = rng.standard_normal((N, K), dtype=np.float32).tobytes()
    tensor_set(b, xb, 0, len(xb))
    be = cpu_init()
    cpu_threads(be, threads)
    graph_compute(be, graph)  # warm up
    times, t_end = [], time.perf_counter() + min_time
    while time.perf_counter() < t_end or len(times) < 3:
        t0 = time.perf_counter()
        graph_compute(be, graph)
        times.append(time.perf_counter() - t0)
    backend_free(be)
    buffer_free(abuf)
    buffer_free(wbuf)
    ggml_free(actx)
    ggml_free(wctx)
    return statistics.median(times), (buft_name(rb).decode() if rb else "CPU")


def time_ours(tool, wtype, M, K, N, threads, min_time, half, disable=None):
    """bench-matmul's GFLOP/s for the same case (the types CPU_REPACK stores, repacked; with half,
    BF16/F16 products under BP_MM_PRECISION_HALF, ggml's precision)."""
    t = wtype + "_repack" if wtype.lower() in ("q8_0", "q4_0", "iq4_nl", "q5_0", "q4_1", "q5_1", "q4_k",
                                       "q5_k", "iq4_xs") else wtype
    if half and wtype in ("bf16", "f16"):
        t += "_half"
    out = subprocess.run([tool, "--types", t, "--M", str(M), "--K", str(K), "--N", str(N),
                          "--threads", str(threads), "--min-time", str(min_time), "--no-limits",
                          "--no-peer"], check=True, capture_output=True, text=True,
                         env=dict(os.environ, BP_CPU_DISABLE=disable) if disable else None).stdout
    m = re.search(r"^mul_mat_%s M=%d,K=%d,N=%d %d ([0-9.]+) GFLOP/s" % (t, M, K, N, threads),
                  out, re.M)
    if not m:
        sys.exit("ggml-peer.py: no figure in bench-matmul's output:\n" + out)
    return float(m.group(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="bf16,f16,q8_0,q4_0")  # or "all"
    ap.add_argument("--shapes", default="4096x4096x512,4096x4096x32,32000x2048x1")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--bench-matmul", default="./bench/bench-matmul")
    ap.add_argument("--ggml-lib", help="directory of another ggml build's libraries")
    ap.add_argument("--no-ggml-repack", action="store_true",
                    help="ggml's weights in its plain CPU buffer, never AMX or CPU_REPACK")
    ap.add_argument("--disable", help="BP_CPU_DISABLE for our side (avx512f: the avx2 variant; "
                    "avx2: the baseline)")
    ap.add_argument("--half", action="store_true",
                    help="our BF16/F16 products under BP_MM_PRECISION_HALF (ggml's rounding)")
    a = ap.parse_args()
    print("# MUL_MAT, %d threads, %d interleaved pairs; ratio = backplane / ggml (median of "
          "per-pair ratios); GFLOP/s medians%s; ggml from %s%s" % (
              a.threads, a.pairs, "; ours at half precision" if a.half else "", LIB,
              "; ours with BP_CPU_DISABLE=" + a.disable if a.disable else ""))
    types = [t for t in GGML_TYPES if t != "f32"] if a.types == "all" else a.types.split(",")
    for shape in a.shapes.split(","):
        M, K, N = (int(v) for v in shape.split("x"))
        for wtype in types:
            flops = 2.0 * M * K * N
            g, o, r = [], [], []
            where = "CPU"
            for _ in range(a.pairs):
                sec, where = time_ggml(wtype, M, K, N, a.threads, a.min_time,
                                       not a.no_ggml_repack)
                g.append(flops / sec * 1e-9)
                o.append(time_ours(a.bench_matmul, wtype, M, K, N, a.threads, a.min_time,
                                   a.half, a.disable))
                r.append(o[-1] / g[-1])
            print("%-5s M=%d K=%d N=%d: backplane %.1f, ggml %.1f GFLOP/s (ggml weights in %s); "
                  "ratio %.2f" % (wtype, M, K, N, statistics.median(o), statistics.median(g),
                                  where, statistics.median(r)), flush=True)


if __name__ == "__main__":
    main()
