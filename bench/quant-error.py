#!/usr/bin/env python3
"""quant-error.py - round-trip error of backplane's quantizers next to independent peers.

Writes test rows (Gaussian, Gaussian with 1% outliers of 8 sigma, and a heavy-tailed Student-t
set), quantizes them with backplane's bp_quantize_rows (through ctypes on the built
libbackplane.so), with the gguf Python package's gguf.quants.quantize (for the types it
implements) and with llama.cpp's ggml_quantize_chunk (through ctypes on libggml-base.so, when
one is given or found), dequantizes every result with gguf.quants.dequantize, and prints the
RMSE per type and data set. With llama.cpp present it also prints the share of blocks whose
bytes are identical to llama.cpp's, with and without an importance matrix.

Not run in CI; a benchmark never fails on a number. Usage:
    python3 bench/quant-error.py [--lib build/.libs/libbackplane.so] [--ggml PATH] [--rows N]
"""
import argparse
import ctypes
import glob
import os
import sys

import numpy as np

try:
    import gguf
    import gguf.quants
except ImportError:  # the peer is optional; our own numbers still print
    gguf = None

# backplane enum bp_type -> (name, ggml type, elements per block, bytes per block)
TYPES = {
    5: ("q4_0", 2, 32, 18), 6: ("q4_1", 3, 32, 20), 7: ("q5_0", 6, 32, 22),
    8: ("q5_1", 7, 32, 24), 4: ("q8_0", 8, 32, 34), 10: ("q2_K", 10, 256, 84),
    11: ("q3_K", 11, 256, 110), 12: ("q4_K", 12, 256, 144), 13: ("q5_K", 13, 256, 176),
    14: ("q6_K", 14, 256, 210), 16: ("iq4_nl", 20, 32, 18), 17: ("iq4_xs", 23, 256, 136),
}
IMATRIX_TYPES = {5, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17}


def load_ours(path):
    lib = ctypes.CDLL(path)
    lib.bp_quantize_rows.restype = ctypes.c_size_t
    lib.bp_quantize_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.bp_last_error.restype = ctypes.c_char_p
    return lib


def find_ggml(given):
    if given:
        return given
    env = os.environ.get("GGML_BASE_LIB")
    if env:
        return env
    hits = sorted(glob.glob("/work/peer/**/libggml-base.so", recursive=True))
    return hits[0] if hits else None


def load_ggml(path):
    lib = ctypes.CDLL(path)
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                        ctypes.c_void_p]
    return lib


def ptr(a):
    return None if a is None else a.ctypes.data


def quantize_ours(lib, t, x, im):
    rows, n = x.shape
    _, _, blk, size = TYPES[t]
    out = np.zeros(rows * (n // blk) * size, np.uint8)
    got = lib.bp_quantize_rows(t, ptr(x), ptr(out), rows, n, ptr(im))
    if got != out.size:
        sys.exit("bp_quantize_rows failed: %s" % lib.bp_last_error().decode())
    return out


def quantize_ggml(lib, t, x, im):
    rows, n = x.shape
    _, gt, blk, size = TYPES[t]
    out = np.zeros(rows * (n // blk) * size, np.uint8)
    lib.ggml_quantize_chunk(gt, ptr(x), ptr(out), 0, rows, n, ptr(im))
    return out


def quantize_gguf(t, x):
    qt = gguf.GGMLQuantizationType[TYPES[t][0].upper()]
    try:
        return gguf.quants.quantize(x, qt).reshape(-1)
    except NotImplementedError:
        return None


def dequantize(t, q, shape):
    qt = gguf.GGMLQuantizationType[TYPES[t][0].upper()]
    rows, n = shape
    return gguf.quants.dequantize(q.reshape(rows, -1), qt).reshape(shape)


def rmse(x, y, w=None):
    w = np.ones(x.shape[1], np.float64) if w is None else w.astype(np.float64)
    d = (x.astype(np.float64) - y) ** 2 * w
    return float(np.sqrt(d.sum() / (w.sum() * x.shape[0])))


def same_blocks(t, a, b):
    size = TYPES[t][3]
    return float(np.mean(np.all(a.reshape(-1, size) == b.reshape(-1, size), axis=1)))


def datasets(rows, n, seed):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((rows, n)).astype(np.float32)
    o = g.copy()
    mask = rng.random((rows, n)) < 0.01
    o[mask] = np.sign(o[mask]) * 8.0
    t = rng.standard_t(3, (rows, n)).astype(np.float32)
    im = (rng.random(n) ** 4 * 20).astype(np.float32)
    # Edge cases per 256-block: all zero, constant, one value of 1000, tiny magnitudes.
    e = rng.standard_normal((rows, n)).astype(np.float32)
    for b in range(n // 256):
        s = slice(256 * b, 256 * b + 256)
        kind = b % 5
        if kind == 0:
            e[:, s] = 0.0
        elif kind == 1:
            e[:, s] = -0.75
        elif kind == 2:
            e[:, 256 * b + 77] = 1000.0
        elif kind == 3:
            e[:, s] *= 1e-6
    return {"gauss": g, "outliers": o, "student-t3": t, "edge": e}, im


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                  ".libs", "libbackplane.so"))
    ap.add_argument("--ggml", help="llama.cpp's libggml-base.so (default: $GGML_BASE_LIB or "
                    "one under /work/peer)")
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    if gguf is None:
        sys.exit("the gguf package is needed to dequantize (pip install gguf)")
    ours = load_ours(args.lib)
    gpath = find_ggml(args.ggml)
    ggml = load_ggml(gpath) if gpath else None
    print("backplane: %s" % os.path.realpath(args.lib))
    print("gguf:      %s" % (getattr(gguf, "__version__", None) or os.path.dirname(gguf.__file__)))
    print("llama.cpp: %s" % (os.path.realpath(gpath) if gpath else "not found (column empty)"))
    sets, im = datasets(args.rows, args.cols, args.seed)
    print("%d rows x %d; RMSE in units of the data (sigma 1 for gauss); 'same' is the share"
          " of blocks identical to llama.cpp's" % (args.rows, args.cols))
    print("%-8s %-10s %9s %9s %9s %6s | %9s %9s %6s" % (
        "type", "data", "ours", "gguf", "llama", "same", "ours+im", "llama+im", "same"))
    for t in sorted(TYPES, key=lambda k: TYPES[k][0]):
        for name, x in sets.items():
            q = quantize_ours(ours, t, x, None)
            row = [rmse(x, dequantize(t, q, x.shape))]
            p = quantize_gguf(t, x)
            row.append(rmse(x, dequantize(t, p, x.shape)) if p is not None else None)
            qi = quantize_ours(ours, t, x, im) if t in IMATRIX_TYPES else None
            if ggml is not None:
                g = quantize_ggml(ggml, t, x, None)
                row += [rmse(x, dequantize(t, g, x.shape)), same_blocks(t, q, g)]
            else:
                row += [None, None]
            if qi is not None:
                row.append(rmse(x, dequantize(t, qi, x.shape), im))
                if ggml is not None:
                    gi = quantize_ggml(ggml, t, x, im)
                    row += [rmse(x, dequantize(t, gi, x.shape), im), same_blocks(t, qi, gi)]
                else:
                    row += [None, None]
            else:
                row += [None, None, None]
            cells = ["%9.5f" % v if v is not None else "%9s" % "-" for v in row[:3]]
            cells.append("%5.1f%%" % (100 * row[3]) if row[3] is not None else "%6s" % "-")
            cells += ["%9.5f" % v if v is not None else "%9s" % "-" for v in row[4:6]]
            cells.append("%5.1f%%" % (100 * row[6]) if row[6] is not None else "%6s" % "-")
            print("%-8s %-10s %s %s %s %s | %s %s %s" % ((TYPES[t][0], name) + tuple(cells)))
    print("(+im: an importance matrix of random column weights; its RMSE is weighted by it)")


if __name__ == "__main__":
    main()
