//! Q4_0 × 16 rows (layout and kernel in `nibbles`, no min, no 5th bit): 288 B a group block,
//! 18 B a row as in the file. Row value = d·(q − 8) (q stored unsigned); the activation slot's
//! exact `Σqa` removes the offset: dot = Σ_blocks d·da·(Σ q·qa − 8·Σqa).

use super::{f16_at, nibbles, ACT_BLOCK_BYTES};

/// Writes row `r`'s Q4_0 block (18 B: d, 16 quant bytes) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    nibbles::pack_quants(&src[2..18], None, false, r, dst);
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let bb = nibbles::block_bytes(false, false);
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * bb..][..bb];
        let xb = &x[b * ACT_BLOCK_BYTES..][..ACT_BLOCK_BYTES];
        let q = nibbles::unpack_ref(wb, false, false, r);
        let isum: i32 = (0..32)
            .map(|e| (i32::from(q[e]) - 8) * i32::from(xb[4 + e] as i8))
            .sum();
        acc += isum as f32 * f16_at(&wb[2 * r..]) * f16_at(xb);
    }
    acc
}
