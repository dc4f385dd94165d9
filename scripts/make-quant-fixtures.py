#!/usr/bin/env python3
"""Reference quantization fixtures from gguf-py (llama.cpp's Python port of ggml's formats).

    pip install gguf numpy
    python3 scripts/make-quant-fixtures.py crates/tinynn-core/tests/fixtures/quant_reference.gguf

Writes one GGUF file holding:
- `input`        F32 [4 rows x 256]: random rows of different scales, a zero row, an outlier row;
- `q.<T>`        `input` quantized by gguf-py to T (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0);
- `dq.<T>`       F32, `q.<T>` dequantized by gguf-py;
- `kq.<T>`       random but well-formed K-quant blocks (Q2_K ... Q6_K; gguf-py cannot quantize them);
- `kdq.<T>`      F32, `kq.<T>` dequantized by gguf-py.
The tests in crates/tinynn-core/tests/quant_reference.rs check our kernels against every tensor
bit for bit. The fixture is committed; CI does not need gguf-py.
"""
import sys

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType as T, quants

rng = np.random.default_rng(20261130)
rows = [
    rng.normal(0.0, 1.0, 256),
    rng.normal(0.5, 0.02, 256),          # small spread around an offset (exercises the minimum)
    np.zeros(256),                        # d = 0 paths
    np.concatenate([rng.uniform(-1, 1, 255), [40.0]]),  # one outlier
]
x = np.stack(rows).astype(np.float32)

w = GGUFWriter(sys.argv[1], arch="fixture")
w.add_tensor("input", x)

for t in [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
    q = quants.quantize(x, t)
    w.add_tensor(f"q.{t.name}", q, raw_dtype=t)
    w.add_tensor(f"dq.{t.name}", quants.dequantize(q, t).astype(np.float32))

# K-quant blocks: random bits, with the f16 scale fields set to sane positive values.
scale_fields = {  # byte offsets of the f16 d (and dmin) fields in each block
    T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
for t, offsets in scale_fields.items():
    block_elems, block_bytes = quants.GGML_QUANT_SIZES[t]
    n_blocks = x.size // block_elems
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for off in offsets:
        vals = rng.uniform(0.001, 0.05, n_blocks).astype(np.float16)
        raw[:, off:off + 2] = vals.view(np.uint8).reshape(n_blocks, 2)
    raw = raw.reshape(x.shape[0], -1)
    w.add_tensor(f"kq.{t.name}", raw, raw_dtype=t)
    w.add_tensor(f"kdq.{t.name}", quants.dequantize(raw, t).astype(np.float32))

w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
