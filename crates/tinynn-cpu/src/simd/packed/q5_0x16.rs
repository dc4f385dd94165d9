//! Q5_0 × 16 rows (layout and kernel in `nibbles`, 5th-bit planes, no min): 352 B a group
//! block, 22 B a row as in the file. Row value = d·(q − 16) (q 5-bit, stored unsigned); the
//! activation slot's exact `Σqa` removes the offset: dot = Σ_blocks d·da·(Σ q·qa − 16·Σqa).

use super::{f16_at, nibbles, ACT_BLOCK_BYTES};

/// Writes row `r`'s Q5_0 block (22 B: d, qh, 16 quant bytes) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    let qh = u32::from_le_bytes([src[2], src[3], src[4], src[5]]);
    nibbles::pack_quants(&src[6..22], Some(qh), false, r, dst);
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let bb = nibbles::block_bytes(false, true);
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * bb..][..bb];
        let xb = &x[b * ACT_BLOCK_BYTES..][..ACT_BLOCK_BYTES];
        let q = nibbles::unpack_ref(wb, false, true, r);
        let isum: i32 = (0..32)
            .map(|e| (i32::from(q[e]) - 16) * i32::from(xb[4 + e] as i8))
            .sum();
        acc += isum as f32 * f16_at(&wb[2 * r..]) * f16_at(xb);
    }
    acc
}
