//! The shape every block format shares: a block type, and scalar reference kernels.

use bytemuck::Pod;
use tinynn_format::GgmlType;

/// A ggml block format: `QK` elements stored in one `Block`.
pub trait Format {
    const TYPE: GgmlType;
    /// Elements per block.
    const QK: usize;
    /// The on-disk block, `#[repr(C)]`, byte-aligned, size checked at compile time.
    type Block: Pod;
    /// The activation format `vec_dot_ref` pairs this format with (ggml's `vec_dot_type`).
    type Dot: Format;

    /// Dequantizes one block into `out` (`out.len() == QK`).
    fn dequantize_block(block: &Self::Block, out: &mut [f32]);

    /// Dot product of one block with one block of the activation format, as ggml's generic
    /// kernels compute it (integer sums where the format has them).
    fn vec_dot_block(x: &Self::Block, y: &<Self::Dot as Format>::Block) -> f32;
}

/// Formats with a reference quantizer (round-to-nearest exactly as ggml's `quantize_row_*_ref`).
pub trait Quantize: Format {
    /// Quantizes `QK` values into one block.
    fn quantize_block(x: &[f32], out: &mut Self::Block);
}

/// Dequantizes whole blocks: `out.len() == blocks.len() * QK`.
pub fn dequantize_ref<F: Format>(blocks: &[F::Block], out: &mut [f32]) {
    debug_assert_eq!(out.len(), blocks.len() * F::QK);
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(F::QK)) {
        F::dequantize_block(b, o);
    }
}

/// Quantizes `x` (a whole number of blocks) into `out`.
pub fn quantize_ref<F: Quantize>(x: &[f32], out: &mut [F::Block]) {
    debug_assert_eq!(x.len(), out.len() * F::QK);
    for (xs, b) in x.chunks_exact(F::QK).zip(out.iter_mut()) {
        F::quantize_block(xs, b);
    }
}

/// Dot product of a row of `F` with a row of its activation format (f32 sum over blocks).
pub fn vec_dot_ref<F: Format>(x: &[F::Block], y: &[<F::Dot as Format>::Block]) -> f32 {
    debug_assert_eq!(x.len(), y.len());
    x.iter().zip(y).map(|(a, b)| F::vec_dot_block(a, b)).sum()
}

/// Index of the element with the largest magnitude (the first one on ties), as ggml picks `max`.
pub(crate) fn abs_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// `1/d`, or 0 when `d` is 0 (ggml's `id = d ? 1.0f/d : 0.0f`).
pub(crate) fn inv_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}
