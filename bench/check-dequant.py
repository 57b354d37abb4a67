#!/usr/bin/env python3
"""check-dequant.py - backplane's dequantizers against gguf.quants.dequantize, bit for bit.

For every tensor of each GGUF file given, reads it twice: through backplane (bp_gguf_open and
bp_gguf_get_tensor, then bp_type_get_traits(type)->to_float, via ctypes on the built
libbackplane.so) and through the gguf Python package (GGUFReader, then
gguf.quants.dequantize), and compares the float32 results bit for bit (a NaN equals a NaN of
the same bits). Prints the type, element count and max abs difference of each tensor and exits
1 if any tensor differs or cannot be read. Not run in CI.

--synthetic also covers the weight types the files lack: Gaussian rows with outliers are
quantized by backplane (bp_quantize_rows, with and without an importance matrix) into each
type gguf can dequantize, and both dequantizers must agree on the blocks bit for bit.

Usage: python3 bench/check-dequant.py [--lib build/.libs/libbackplane.so] [--synthetic]
                                      [FILE.gguf ...]
"""
import argparse
import ctypes
import os
import sys

import numpy as np
import gguf
import gguf.quants


class GgufTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("ggml_type", ctypes.c_int),
                ("type_name", ctypes.c_char_p), ("type", ctypes.c_int),
                ("supported", ctypes.c_bool), ("n_dims", ctypes.c_int),
                ("ne", ctypes.c_int64 * 4), ("offset", ctypes.c_size_t),
                ("size", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class Traits(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("block_size", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool),
                ("to_float", ctypes.c_void_p), ("from_float", ctypes.c_void_p)]


TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


def load(path):
    lib = ctypes.CDLL(path)
    lib.bp_gguf_open.restype = ctypes.c_void_p
    lib.bp_gguf_open.argtypes = [ctypes.c_char_p]
    lib.bp_gguf_close.argtypes = [ctypes.c_void_p]
    lib.bp_gguf_get_n_tensors.restype = ctypes.c_int64
    lib.bp_gguf_get_n_tensors.argtypes = [ctypes.c_void_p]
    lib.bp_gguf_get_tensor.restype = ctypes.c_int
    lib.bp_gguf_get_tensor.argtypes = [ctypes.c_void_p, ctypes.c_int64,
                                       ctypes.POINTER(GgufTensor)]
    lib.bp_type_get_traits.restype = ctypes.POINTER(Traits)
    lib.bp_type_get_traits.argtypes = [ctypes.c_int]
    lib.bp_last_error.restype = ctypes.c_char_p
    return lib


def ours(lib, path):
    """name -> (type name, float32 array) through backplane."""
    g = lib.bp_gguf_open(path.encode())
    if not g:
        sys.exit("%s: %s" % (path, lib.bp_last_error().decode()))
    out = {}
    try:
        for i in range(lib.bp_gguf_get_n_tensors(g)):
            info = GgufTensor()
            status = lib.bp_gguf_get_tensor(g, i, ctypes.byref(info))
            name = info.name.decode()
            if status != 0:
                out[name] = (info.type_name.decode(), lib.bp_last_error().decode())
                continue
            n = int(np.prod([info.ne[k] for k in range(4)]))
            y = np.empty(n, np.float32)
            tr = lib.bp_type_get_traits(info.type).contents
            TO_FLOAT(tr.to_float)(info.data, y.ctypes.data, n)
            out[name] = (info.type_name.decode(), y)
    finally:
        lib.bp_gguf_close(g)
    return out


def bits_equal(a, b):
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


def check(lib, path):
    mine = ours(lib, path)
    reader = gguf.GGUFReader(path)
    bad = 0
    print("%s: %d tensors" % (path, len(reader.tensors)))
    for t in reader.tensors:
        ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(-1)
        tname, y = mine.get(t.name, ("?", "missing from backplane's reading"))
        if isinstance(y, str):
            print("  %-40s %-7s ERROR: %s" % (t.name, tname, y))
            bad += 1
            continue
        if bits_equal(y, ref):
            diff = 0.0
        else:
            bad += 1
            with np.errstate(invalid="ignore"):
                diff = float(np.nanmax(np.abs(y.astype(np.float64) - ref)))
        print("  %-40s %-7s %10d  max|diff| %g%s" % (t.name, tname, y.size, diff,
                                                    "" if bits_equal(y, ref) else "  DIFFERS"))
    return bad


# backplane enum bp_type -> gguf's name, for --synthetic
SYNTHETIC = {4: "Q8_0", 5: "Q4_0", 6: "Q4_1", 7: "Q5_0", 8: "Q5_1", 10: "Q2_K", 11: "Q3_K",
             12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ4_NL", 17: "IQ4_XS"}


def check_synthetic(lib):
    lib.bp_quantize_rows.restype = ctypes.c_size_t
    lib.bp_quantize_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    rng = np.random.default_rng(3)
    rows, n = 32, 4096
    x = rng.standard_normal((rows, n)).astype(np.float32)
    x[rng.random((rows, n)) < 0.01] *= 20
    im = (rng.random(n) ** 4 * 20).astype(np.float32)
    bad = 0
    print("synthetic: %d rows x %d, Gaussian with 1%% outliers" % (rows, n))
    for t, name in SYNTHETIC.items():
        qt = gguf.GGMLQuantizationType[name]
        tr = lib.bp_type_get_traits(t).contents
        for imatrix in (None, im):
            q = np.zeros(rows * n // tr.block_size * tr.type_size, np.uint8)
            lib.bp_quantize_rows(t, x.ctypes.data, q.ctypes.data, rows, n,
                                 None if imatrix is None else imatrix.ctypes.data)
            y = np.empty(rows * n, np.float32)
            TO_FLOAT(tr.to_float)(q.ctypes.data, y.ctypes.data, rows * n)
            ref = gguf.quants.dequantize(q.reshape(rows, -1), qt).astype(np.float32).reshape(-1)
            same = bits_equal(y, ref)
            bad += not same
            diff = 0.0 if same else float(np.nanmax(np.abs(y.astype(np.float64) - ref)))
            print("  %-7s %-10s max|diff| %g%s" % (name.lower(), "imatrix" if imatrix is not None
                                                  else "plain", diff, "" if same else
                                                  "  DIFFERS"))
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                  ".libs", "libbackplane.so"))
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("files", nargs="*")
    args = ap.parse_args()
    if not args.files and not args.synthetic:
        ap.error("give GGUF files, --synthetic or both")
    lib = load(args.lib)
    bad = sum(check(lib, f) for f in args.files)
    if args.synthetic:
        bad += check_synthetic(lib)
    print("%s: %d tensor(s) differ" % ("FAIL" if bad else "OK", bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
