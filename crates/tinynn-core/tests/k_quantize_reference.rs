//! Our K-quant quantizers against ggml's, byte for byte.
//!
//! The fixture's bytes come from ggml's `quantize_row_q2_K_ref` … `quantize_row_q6_K_ref`
//! (ggml 0.25.3, as bundled in llama-cpp-python 0.3.36's source package), compiled with gcc on
//! x86-64 and run locally on the rows below; ggml's code is not part of this repository.
//! `scripts/make-k-quant-reference.py LLAMA_BUILD` regenerates it (its own C program against a
//! local build's `libggml-base.so`; the rows from a seeded `random.Random`).
//!
//! Layout of `fixtures/k_quant_reference.bin` (little-endian): the magic `TNKQREF1`, `u32` row
//! count, `u32` elements per row (two super-blocks), the rows as f32, then for each of Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K in that order, every row's quantized bytes. The rows, in order:
//! random normal; small values (σ = 0.02) with per-sub-block offsets; tiny values (σ = 1e-6);
//! values below ggml's `GROUP_MAX_EPS` (σ = 1e-17); all zero; normal with ±300 outliers;
//! constant 0.75; constant −1.25; all positive (|normal| + 0.5); normal ×3 with every other
//! 16-element sub-block zero.

use tinynn_core::quant::{quantize_row, row_bytes};
use tinynn_format::GgmlType;

const FIXTURE: &[u8] = include_bytes!("fixtures/k_quant_reference.bin");

const ROW_NAMES: [&str; 10] = [
    "normal",
    "small offset",
    "tiny",
    "below GROUP_MAX_EPS",
    "zero",
    "outliers",
    "constant +0.75",
    "constant -1.25",
    "all positive",
    "zero sub-blocks",
];

const TYPES: [GgmlType; 5] = [
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

fn u32_at(b: &[u8], at: usize) -> usize {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize
}

#[test]
fn k_quants_match_ggml_byte_for_byte() {
    assert_eq!(&FIXTURE[..8], b"TNKQREF1");
    let (rows, n) = (u32_at(FIXTURE, 8), u32_at(FIXTURE, 12));
    assert_eq!(rows, ROW_NAMES.len());
    let mut at = 16;
    let inputs: Vec<Vec<f32>> = (0..rows)
        .map(|_| {
            let row = FIXTURE[at..at + 4 * n]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            at += 4 * n;
            row
        })
        .collect();

    let mut compared = 0;
    for ty in TYPES {
        let len = row_bytes(ty, n).unwrap();
        for (x, name) in inputs.iter().zip(ROW_NAMES) {
            let want = &FIXTURE[at..at + len];
            at += len;
            let mut got = vec![0u8; len];
            quantize_row(ty, x, &mut got).unwrap();
            if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
                let block = len / (n / 256);
                panic!(
                    "{ty}, row {name:?}: byte {i} (block {}, offset {}) is {:#04x}, ggml wrote {:#04x}",
                    i / block,
                    i % block,
                    got[i],
                    want[i]
                );
            }
            compared += len;
        }
    }
    assert_eq!(at, FIXTURE.len(), "fixture has trailing bytes");
    assert_eq!(compared, rows * 2 * (84 + 110 + 144 + 176 + 210));
}
