#!/usr/bin/env python3
"""What llama-quantize makes of the project's two real models for the K-quant mixes without an
importance matrix (Q2_K, Q3_K_S/M/L; Q4_K_M and Q5_K_M for comparison): per target and tensor,
the type it chose and the SHA-256 of the tensor's bytes. Written to
crates/tinynn-models/tests/fixtures/llama-quantize-types.json, which tests/quantize_mixes.rs
checks `tnn quantize`'s plan and output against.

Needs a llama-quantize built locally (not part of this project) and the `gguf` Python package:

    LLAMA_QUANTIZE=/path/to/llama-quantize scripts/make-quantize-types.py

Inputs: the default model dequantized to F32 by `tnn quantize MODEL OUT F32 --allow-requantize`
(both tools then quantize the same numbers), and Gemma 3 270M Q4_K_M requantized as it is
(--allow-requantize; only the types are kept for it).
"""
import hashlib, json, os, subprocess, sys, tempfile

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LQ = os.environ.get("LLAMA_QUANTIZE") or sys.exit("set LLAMA_QUANTIZE")
TARGETS = ["Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_M", "Q5_K_M"]


def tnn(*args):
    return subprocess.run([os.path.join(ROOT, "target/release/tnn"), *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def describe(path, hashes):
    r = gguf.GGUFReader(path)
    out = {}
    for t in r.tensors:
        entry = {"type": t.tensor_type.name}
        if hashes:
            entry["sha256"] = hashlib.sha256(bytes(t.data.view("uint8").reshape(-1))).hexdigest()
        out[t.name] = entry
    return out


def main():
    smol = tnn("pull", "smollm2")
    gemma = tnn("pull", "gemma3")
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = os.path.join(tmp, "smol-f32.gguf")
        tnn("quantize", smol, f32, "F32", "--allow-requantize")
        for model, src, hashes in [("smollm2", f32, True), ("gemma3", gemma, False)]:
            result[model] = {}
            for target in TARGETS:
                out = os.path.join(tmp, f"{model}-{target}.gguf")
                subprocess.run([LQ, "--allow-requantize", src, out, target, "2"], check=True,
                               capture_output=True)
                result[model][target] = describe(out, hashes)
                os.remove(out)
    path = os.path.join(ROOT, "crates/tinynn-models/tests/fixtures/llama-quantize-types.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
        f.write("\n")
    print(path)


main()
