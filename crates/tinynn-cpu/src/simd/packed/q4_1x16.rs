//! Q4_1 × 16 rows (layout and kernel in `nibbles`, with a min and no 5th bit): 320 B a group
//! block. Row value = d·q + m; with activations `x = da·qa` and `sa = da·Σqa`:
//! dot = Σ_blocks d·da·Σ q·qa + m·sa.

use super::{f16_at, nibbles, ACT_BLOCK_BYTES};

/// Writes row `r`'s Q4_1 block (20 B: d, m, 16 quant bytes) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    dst[nibbles::M_AT + 2 * r..][..2].copy_from_slice(&src[2..4]);
    nibbles::pack_quants(&src[4..20], None, true, r, dst);
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let bb = nibbles::block_bytes(true, false);
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * bb..][..bb];
        let xb = &x[b * ACT_BLOCK_BYTES..][..ACT_BLOCK_BYTES];
        let q = nibbles::unpack_ref(wb, true, false, r);
        let isum: i32 = (0..32)
            .map(|e| i32::from(q[e]) * i32::from(xb[4 + e] as i8))
            .sum();
        let (d, m) = (f16_at(&wb[2 * r..]), f16_at(&wb[nibbles::M_AT + 2 * r..]));
        acc += isum as f32 * d * f16_at(xb) + m * f16_at(&xb[2..]);
    }
    acc
}
