#!/usr/bin/env python3
"""Writes tests/gguf/reference.gguf with the GGUF project's own Python package (pip install gguf),
and tests/gguf/reference.txt: that package's reading of every tensor (dequantised by the
package) and metadata value, which tests/test-gguf.c compares with backplane's reader.

The two files are committed, so the tests need neither the package nor a network; rerun this
to regenerate them (the random weights are seeded, the output is the same every time).
"""
import importlib.metadata
import os
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

here = os.path.dirname(os.path.abspath(__file__))
path = os.path.join(here, "reference.gguf")
rng = np.random.default_rng(20261201)

w = gguf.GGUFWriter(path, "llama")
w.add_uint32("test.u32", 4000000000)
w.add_int32("test.i32", -123456)
w.add_float32("test.f32", 0.15625)
w.add_float64("test.f64", -2.5e-300)
w.add_bool("test.bool", True)
w.add_string("test.str", "héllo, wörld")
w.add_uint8("test.u8", 250)
w.add_int8("test.i8", -7)
w.add_uint16("test.u16", 65000)
w.add_int16("test.i16", -32000)
w.add_uint64("test.u64", 1 << 40)
w.add_int64("test.i64", -(1 << 50))
w.add_array("test.arr_i32", [1, -2, 3, -4, 5])
w.add_array("test.arr_str", ["a", "", "日本語"])
w.add_array("test.arr_f32", [0.5, -0.25])
w.add_context_length(256)
w.add_embedding_length(64)

shapes = {  # name: (numpy shape (rows, cols)), type
    "t.f32": ((3, 40), Q.F32),
    "t.f16": ((5, 32), Q.F16),
    "t.bf16": ((2, 48), Q.BF16),
    "t.q8_0": ((4, 64), Q.Q8_0),
    "t.q4_0": ((3, 96), Q.Q4_0),
    "t.vec": ((1, 7), Q.F32),
}
expected = []
for name, (shape, qt) in shapes.items():
    data = rng.standard_normal(shape).astype(np.float32)
    if qt == Q.F32:
        raw = data
    elif qt == Q.F16:
        raw = data.astype(np.float16)
    else:
        raw = gguf.quants.quantize(data, qt)
    w.add_tensor(name, raw, raw_dtype=qt)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()

# The package's own reading of what it wrote.
r = gguf.GGUFReader(path)
lines = []
for t in r.tensors:
    values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(-1)
    dims = " ".join(str(int(d)) for d in t.shape)
    lines.append(f"tensor {t.name} {t.tensor_type.name.lower()} {len(t.shape)} {dims} "
                 f"{int(t.data_offset)} {int(t.n_bytes)}")
    lines.append("values " + " ".join(repr(float(v)) for v in values))
for f in r.fields.values():
    if not f.name.startswith("test."):
        continue
    vals = [f.contents(i) for i in range(len(f.data))] if f.types[0] == gguf.GGUFValueType.ARRAY \
        else [f.contents()]
    lines.append(f"kv {f.name} " + "\t".join(repr(v) for v in vals))
with open(os.path.join(here, "reference.txt"), "w") as out:
    out.write(f"# written by make-reference.py with gguf {importlib.metadata.version('gguf')}\n")
    out.write("\n".join(lines) + "\n")
print(f"wrote {path} ({os.path.getsize(path)} bytes)", file=sys.stderr)
