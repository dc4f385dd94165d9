//! F32 × 16 rows. Group block (2048 B) of 32 elements: for each element `i` the 16 rows' f32
//! weights side by side (64 B, one cache line), so one aligned load gives 16 rows of one
//! column. Activations are the f32 values themselves (4 B each), read with the FMA's
//! broadcast load (the kernel is `wide`'s, shared with F16). Decode of F32 weights streams
//! them at memory speed this way; the unpacked path dotted one row at a time.

/// Writes row `r`'s 32 f32 weights (128 B) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for i in 0..32 {
        dst[64 * i + 4 * r..][..4].copy_from_slice(&src[4 * i..][..4]);
    }
}

/// The inverse of [`pack_block`].
pub(super) fn unpack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for i in 0..32 {
        dst[4 * i..][..4].copy_from_slice(&src[64 * i + 4 * r..][..4]);
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    (0..nb * 32)
        .map(|e| f(&w[64 * e + 4 * r..]) * f(&x[4 * e..]))
        .sum()
}
