//! How a packed weight's activation rows are prepared: the kind's [`ActFormat`], its bytes,
//! and the conversion of f32 rows into it.

use super::{ActFormat, PackedWeight, ACT_BLOCK_BYTES, BLOCK, Q8K_BLOCK_BYTES, SUPER};

impl PackedWeight {
    /// Bytes of `n` (whole 32-element blocks) prepared activations.
    pub fn activation_bytes(&self, n: usize) -> usize {
        match self.kind.activation_format() {
            ActFormat::Q8_1 | ActFormat::Q8_1IntSum => n / BLOCK * ACT_BLOCK_BYTES,
            ActFormat::Q8K => n / SUPER * Q8K_BLOCK_BYTES,
            ActFormat::F32RoundedF16 | ActFormat::F32 => n * 4,
            ActFormat::Bf16 => n * 2,
        }
    }

    /// Bytes of one prepared activation row.
    pub fn activation_row_bytes(&self) -> usize {
        self.activation_bytes(self.k)
    }

    /// Converts f32 activations (a row, or a run of whole blocks of one) into the kind's
    /// activation format in `out` (`activation_bytes(x.len())` bytes).
    pub fn prepare_activations(&self, x: &[f32], out: &mut [u8]) {
        use crate::simd::quantize_q8;
        match self.kind.activation_format() {
            ActFormat::Q8_1 => quantize_q8::q8_1_row(x, out, false),
            ActFormat::Q8_1IntSum => quantize_q8::q8_1_row(x, out, true),
            ActFormat::Q8K => quantize_q8::q8_k_row(x, out),
            ActFormat::F32RoundedF16 => quantize_q8::round_f16_row(x, out),
            ActFormat::Bf16 => quantize_q8::bf16_row(x, out),
            ActFormat::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
}
