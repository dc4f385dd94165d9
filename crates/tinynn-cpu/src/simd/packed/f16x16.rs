//! F16 × 16 rows. Group block (1024 B) of 32 elements: for each element `i` the 16 rows'
//! f16 weights side by side (32 B), so one `vcvtph2ps` gives 16 rows of one column.
//!
//! Activations are f32 values rounded to f16 (4 B each): the products and sums are those of
//! ggml's F16 dot (activations converted to f16, f16·f16 products accumulated in f32; the
//! product of two f16s is exact in f32), while the kernel reads each activation with the
//! FMA's own broadcast load instead of a convert per token and element (the kernel is `wide`'s,
//! shared with F32).

/// Writes row `r`'s 32 f16 weights (64 B) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for i in 0..32 {
        dst[32 * i + 2 * r..][..2].copy_from_slice(&src[2 * i..][..2]);
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for e in 0..nb * 32 {
        let xv = f32::from_le_bytes([x[4 * e], x[4 * e + 1], x[4 * e + 2], x[4 * e + 3]]);
        acc += super::f16_at(&w[32 * e + 2 * r..]) * xv;
    }
    acc
}
