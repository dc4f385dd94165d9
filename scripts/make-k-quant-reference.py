#!/usr/bin/env python3
"""Regenerates crates/tinynn-core/tests/fixtures/k_quant_reference.bin: ggml's own K-quant
quantizers (`quantize_row_q2_K_ref` ... `quantize_row_q6_K_ref`) run on ten rows of two
super-blocks each, which `k_quantize_reference.rs` then compares with tinynn's byte for byte.

    python3 scripts/make-k-quant-reference.py LLAMA_BUILD [OUT]

LLAMA_BUILD is a build of llama.cpp holding `bin/libggml-base.so` (made outside this repository
from the llama.cpp sources bundled in llama-cpp-python's source package; nothing of it is
committed). The script writes a small C program of its own that declares the five reference
functions (exported by ggml-base), compiles it with `cc`, feeds it the rows and assembles the
fixture. The committed fixture was made with llama-cpp-python 0.3.36 (ggml 0.25.3), gcc 12,
x86-64, Python 3.11 (the rows come from `random.Random(20261201)`, stable across versions).

Layout (little-endian): `TNKQREF1`, u32 row count, u32 elements per row, the rows as f32, then
for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K in that order every row's quantized bytes.
"""
import os
import random
import struct
import subprocess
import sys
import tempfile

N = 512  # two super-blocks
TYPES = [("q2_K", 84), ("q3_K", 110), ("q4_K", 144), ("q5_K", 176), ("q6_K", 210)]
OUT = "crates/tinynn-core/tests/fixtures/k_quant_reference.bin"

PROGRAM = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

void quantize_row_q2_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q3_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q4_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q5_K_ref(const float *x, void *y, int64_t k);
void quantize_row_q6_K_ref(const float *x, void *y, int64_t k);

/* stdin: ROWS x N f32; stdout: for each type in order, every row's blocks. */
int main(int argc, char **argv) {
    int rows = atoi(argv[1]), n = atoi(argv[2]);
    float *x = malloc(sizeof(float) * rows * n);
    if (fread(x, sizeof(float), (size_t)rows * n, stdin) != (size_t)rows * n) return 1;
    void (*fns[5])(const float *, void *, int64_t) = {
        quantize_row_q2_K_ref, quantize_row_q3_K_ref, quantize_row_q4_K_ref,
        quantize_row_q5_K_ref, quantize_row_q6_K_ref};
    int bytes[5] = {84, 110, 144, 176, 210};
    unsigned char *y = malloc(256 * 2);
    for (int t = 0; t < 5; t++) {
        for (int r = 0; r < rows; r++) {
            fns[t](x + (size_t)r * n, y, n);
            fwrite(y, 1, (size_t)bytes[t] * (n / 256), stdout);
        }
    }
    return 0;
}
"""


def f32(v):
    """v rounded to f32 (the rows are stored and quantized as f32)."""
    return struct.unpack("<f", struct.pack("<f", v))[0]


def rows():
    """The ten rows, in the order `k_quantize_reference.rs` names them."""
    rng = random.Random(20261201)
    normal = lambda s=1.0: [rng.gauss(0.0, s) for _ in range(N)]
    small = [rng.gauss(0.0, 0.02) + 0.05 * ((i // 16) % 5 - 2) for i in range(N)]
    outliers = normal()
    for i in range(0, N, 37):
        outliers[i] = 300.0 if (i // 37) % 2 == 0 else -300.0
    zero_sub = [0.0 if (i // 16) % 2 else 3.0 * rng.gauss(0.0, 1.0) for i in range(N)]
    out = [
        normal(),  # normal
        small,  # small offset
        normal(1e-6),  # tiny
        normal(1e-17),  # below GROUP_MAX_EPS
        [0.0] * N,  # zero
        outliers,  # outliers
        [0.75] * N,  # constant +0.75
        [-1.25] * N,  # constant -1.25
        [abs(v) + 0.5 for v in normal()],  # all positive
        zero_sub,  # zero sub-blocks
    ]
    return [[f32(v) for v in r] for r in out]


def main():
    build = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else OUT
    data = rows()
    tmp = tempfile.mkdtemp()
    c, exe = os.path.join(tmp, "kq.c"), os.path.join(tmp, "kq")
    with open(c, "w") as f:
        f.write(PROGRAM)
    lib = os.path.join(build, "bin")
    subprocess.run(["cc", "-O2", c, "-o", exe, f"-L{lib}", "-lggml-base", f"-Wl,-rpath,{lib}"],
                   check=True)
    flat = b"".join(struct.pack(f"<{N}f", *r) for r in data)
    run = subprocess.run([exe, str(len(data)), str(N)], input=flat, capture_output=True,
                         check=True)
    want = sum(b * (N // 256) * len(data) for _, b in TYPES)
    assert len(run.stdout) == want, (len(run.stdout), want)
    with open(out, "wb") as f:
        f.write(b"TNKQREF1" + struct.pack("<II", len(data), N) + flat + run.stdout)
    print(out, len(data), "rows,", len(run.stdout), "quantized bytes")


if __name__ == "__main__":
    main()
