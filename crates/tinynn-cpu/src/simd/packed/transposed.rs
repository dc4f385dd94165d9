//! A frozen weight's transpose requantized to Q8_0 blocks of 7-bit quants, for its gradient
//! product `Wᵀ·dy` (`mul_mat_t`): with it that product is a forward product of the integer
//! kernels (`dy`'s rows quantized to Q8_1 blocks like any activations) instead of dequantized
//! panels through the f32 GEMM.
//!
//! Not exact: `Wᵀ`'s values are rounded to 8 bits (7 at AVX2, below) per 32 along the other
//! axis (at most half a step of 1/127 (1/63) of the block's largest), and `dy` to 8 bits per 32 (as the forward pass does
//! to activations) — the order of the bf16 rounding of the usual QLoRA backward.
//!
//! 7 bits only where the AVX2 tiles run (no AVX-512 VNNI): that tile then takes the biased
//! quants as its unsigned operand with no sign step (`PackKind::Q7_0x16`), a few percent of a
//! whole QLoRA step. With AVX-512 VNNI the copy keeps ggml's 8-bit Q8_0 quants (1/127 steps),
//! since that tile runs both at one speed.

use tinynn_core::quant;
use tinynn_format::GgmlType;

use super::{pack, PackKind, PackedWeight, GROUP_ROWS};

/// Weight rows dequantized per pass while transposing (each pass writes whole 64-byte
/// runs of 16 values into every transposed row).
const PASS_ROWS: usize = GROUP_ROWS;

impl PackedWeight {
    /// Gives this copy its transpose for the gradient product ([`Self::transposed_q8_0`]);
    /// false (and nothing changes) when there is none.
    pub fn add_backward_q8_0(&mut self) -> bool {
        self.backward = self.transposed_q8_0().map(Box::new);
        self.backward.is_some()
    }

    /// The transpose `mul_mat_t` reads instead of this copy, if one was added.
    pub fn backward(&self) -> Option<&PackedWeight> {
        self.backward.as_deref()
    }

    /// `Wᵀ` (`[n_rows, k]` as ggml dims: `k` rows of `n_rows` values) requantized to Q8_0
    /// (7-bit quants by `quantize_row_q7` where the AVX2 tiles run) and packed, or `None`
    /// when `n_rows` is not whole Q8_0 blocks, the source type has no dequantizer, the machine
    /// has no packed Q8_0 kernel, or the memory is refused.
    pub fn transposed_q8_0(&self) -> Option<PackedWeight> {
        let [k, n] = self.shape();
        if !n.is_multiple_of(32) {
            return None;
        }
        let mut t = Vec::new();
        t.try_reserve_exact(k.checked_mul(n)?).ok()?;
        t.resize(k * n, 0f32);
        let mut rows = vec![0f32; PASS_ROWS * k];
        for r0 in (0..n).step_by(PASS_ROWS) {
            let nr = PASS_ROWS.min(n - r0);
            for (r, row) in rows.chunks_exact_mut(k).take(nr).enumerate() {
                if !self.dequantize_row(r0 + r, row) {
                    return None;
                }
            }
            // t[i·n + r0 + r] = W[r0 + r][i]: row i of Wᵀ gets this pass's nr values.
            for (i, dst) in t.chunks_exact_mut(n).enumerate() {
                for (r, d) in dst[r0..r0 + nr].iter_mut().enumerate() {
                    *d = rows[r * k + i];
                }
            }
        }
        let row_bytes = quant::row_bytes(GgmlType::Q8_0, n).ok()?;
        let mut bytes = vec![0u8; row_bytes * k];
        let seven = !super::wide();
        for (src, dst) in t.chunks_exact(n).zip(bytes.chunks_exact_mut(row_bytes)) {
            if seven {
                quantize_row_q7(src, dst);
            } else {
                quant::quantize_row(GgmlType::Q8_0, src, dst).ok()?;
            }
        }
        drop(t);
        let mut packed = pack(GgmlType::Q8_0, [n, k, 1, 1], &bytes)?;
        if seven {
            packed.kind = PackKind::Q7_0x16;
        }
        Some(packed)
    }
}

/// `x` (whole blocks of 32) as Q8_0 blocks (34 B: f16 `d`, 32 × i8) whose quants lie within
/// ±63: `d = amax / 63`, `q = round(x / d)`, as ggml's Q8_0 quantizer does with 127.
pub(super) fn quantize_row_q7(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 63.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for (o, v) in ob[2..].iter_mut().zip(xb) {
            *o = (v * id).round().clamp(-63.0, 63.0) as i8 as u8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of `k` values in [-1, 1) quantized to `ty`.
    fn weight(ty: GgmlType, k: usize, n: usize, seed: u64) -> Vec<u8> {
        let mut rng = tinynn_core::rng::Rng::new(seed);
        let vals: Vec<f32> = (0..k * n).map(|_| rng.range_f32(-1.0, 1.0)).collect();
        let rb = quant::row_bytes(ty, k).unwrap();
        let mut bytes = vec![0u8; rb * n];
        for (src, dst) in vals.chunks_exact(k).zip(bytes.chunks_exact_mut(rb)) {
            quant::quantize_row(ty, src, dst).unwrap();
        }
        bytes
    }

    #[test]
    fn the_transpose_holds_the_weight_to_within_its_rounding() {
        if !crate::simd::required_by_test(
            "packed Q8_0 kernels",
            super::super::packs(GgmlType::Q8_0),
        ) {
            return;
        }
        // Row counts past one pass and one group; several source kinds.
        for (ty, k, n) in [
            (GgmlType::Q4_1, 64, 96),
            (GgmlType::Q8_0, 96, 32),
            (GgmlType::Q4_0, 32, 160),
            (GgmlType::Q5_1, 128, 64),
        ] {
            let bytes = weight(ty, k, n, k as u64 * 31 + n as u64);
            let p = pack(ty, [k, n, 1, 1], &bytes).unwrap();
            let t = p.transposed_q8_0().unwrap();
            assert_eq!(t.shape(), [n, k]);
            assert_eq!(t.source_type(), GgmlType::Q8_0);
            // 7-bit quants where the AVX2 tiles run, else ggml's Q8_0.
            let (kind, bound) = match super::super::wide() {
                true => (PackKind::Q8_0x16, 127),
                false => (PackKind::Q7_0x16, 63),
            };
            assert_eq!(t.kind(), kind);
            // Every quant within the bound (what the AVX2 tile relies on), and some at it.
            let mut raw = vec![0u8; t.row_bytes()];
            let mut at_bound = false;
            for i in 0..k {
                t.unpack_row(i, &mut raw);
                for q in raw.chunks_exact(34).flat_map(|b| &b[2..]) {
                    let q = i32::from(*q as i8);
                    assert!(q.abs() <= bound, "{ty}: quant {q}");
                    at_bound |= q.abs() == bound;
                }
            }
            assert!(at_bound, "{ty}: no quant at ±{bound}");
            let mut wt = vec![0f32; n];
            let mut rows = vec![vec![0f32; k]; n];
            for (r, row) in rows.iter_mut().enumerate() {
                assert!(p.dequantize_row(r, row));
            }
            for i in 0..k {
                assert!(t.dequantize_row(i, &mut wt));
                // Column i of W: row i of the transpose.
                let col: Vec<f32> = rows.iter().map(|r| r[i]).collect();
                for (b, (want, got)) in col.chunks_exact(32).zip(wt.chunks_exact(32)).enumerate() {
                    let amax = want.iter().fold(0f32, |m, v| m.max(v.abs()));
                    // Half a step of amax/bound, plus the f16 scale's rounding.
                    let tol = amax / bound as f32 * 0.5 + amax * 1e-3 + 1e-7;
                    for (j, (w, g)) in want.iter().zip(got).enumerate() {
                        assert!(
                            (w - g).abs() <= tol,
                            "{ty} k={k} n={n}: Wt[{i}][{}] = {g}, W = {w}",
                            b * 32 + j
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rows_that_are_not_whole_blocks_get_no_transpose() {
        if !crate::simd::required_by_test(
            "packed Q4_1 kernels",
            super::super::packs(GgmlType::Q4_1),
        ) {
            return;
        }
        let bytes = weight(GgmlType::Q4_1, 64, 48, 7);
        let p = pack(GgmlType::Q4_1, [64, 48, 1, 1], &bytes).unwrap();
        assert!(p.transposed_q8_0().is_none());
    }
}
