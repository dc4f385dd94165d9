#!/usr/bin/env python3
"""Writes the reference GGUF fixture with gguf-py (the llama.cpp project's Python GGUF writer).

    pip install gguf numpy
    python3 scripts/make-gguf-fixture.py crates/tinynn-format/tests/fixtures/gguf_py_reference.gguf

The test `tests/gguf_reference.rs` reads it back and checks every value below, so our reader is
checked against an independent writer. The fixture is committed; CI does not need gguf-py.
"""
import sys

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType

out = sys.argv[1]
w = GGUFWriter(out, arch="qwen2")
w.add_custom_alignment(64)
w.add_name("reference fixture")
w.add_context_length(4096)
w.add_embedding_length(64)
w.add_block_count(2)
w.add_head_count(4)
w.add_head_count_kv(2)
w.add_rope_freq_base(1000000.0)
w.add_layer_norm_rms_eps(1e-6)
w.add_uint8("ref.u8", 200)
w.add_int8("ref.i8", -100)
w.add_uint16("ref.u16", 60000)
w.add_int16("ref.i16", -30000)
w.add_int32("ref.i32", -2000000000)
w.add_float32("ref.f32", 3.5)
w.add_uint64("ref.u64", 2**63 + 5)
w.add_int64("ref.i64", -(2**62))
w.add_float64("ref.f64", 2.0**-40)
w.add_bool("ref.bool", False)
w.add_string("ref.string", "naïve ✓")
w.add_array("ref.ints", [1, 2, 3])
w.add_array("ref.floats", [0.25, -1.5])
w.add_array("ref.strings", ["a", "", "ü"])
w.add_array("ref.nested", [[1, 2], [3]])
w.add_tokenizer_model("gpt2")
w.add_token_list(["<s>", "</s>", "hi"])

f32 = np.arange(12, dtype=np.float32).reshape(3, 4)
f16 = (np.arange(8, dtype=np.float16) / 4).reshape(2, 4)
q8 = np.arange(2 * 34, dtype=np.uint8).reshape(1, 68)  # 2 raw Q8_0 blocks: one row of 64
w.add_tensor("t.f32", f32)
w.add_tensor("t.f16", f16)
w.add_tensor("t.q8_0", q8, raw_dtype=GGMLQuantizationType.Q8_0)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
