//! ggml's block formats, bit-exact with GGUF files.
//!
//! Each format is a type implementing [`Format`] (block struct + reference dequantize and
//! vec_dot) and, where implemented, [`Quantize`]. The functions at the bottom of this file
//! dispatch on a [`GgmlType`] for code that only knows the type at run time (rows of bytes).

mod float;
mod format;
pub mod half;
mod k_common;
mod k_quantize;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
mod q8_1;
mod q8_k;

pub use float::{Bf16, Le, F16, F32};
pub use format::{dequantize_ref, quantize_ref, vec_dot_ref, Format, Quantize};
pub use k_common::{KUnpacked, QK_K};
pub use q2_k::{BlockQ2K, Q2K};
pub use q3_k::{BlockQ3K, Q3K};
pub use q4_0::{BlockQ4_0, Q4_0};
pub use q4_1::{BlockQ4_1, Q4_1};
pub use q4_k::{BlockQ4K, Q4K};
pub use q5_0::{BlockQ5_0, Q5_0};
pub use q5_1::{BlockQ5_1, Q5_1};
pub use q5_k::{BlockQ5K, Q5K};
pub use q6_k::{BlockQ6K, Q6K};
pub use q8_0::{BlockQ8_0, Q8_0};
pub use q8_1::{BlockQ8_1, Q8_1};
pub use q8_k::{BlockQ8K, Q8K};

use tinynn_format::GgmlType;

/// Why a row operation could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{0} is not supported by the engine yet")]
    Unsupported(GgmlType),
    #[error("{ty}: {n} elements is not a whole number of {qk}-element blocks")]
    PartialBlock { ty: GgmlType, n: usize, qk: usize },
    #[error("{ty}: {what} holds {got} bytes, {n} elements need {need}")]
    WrongLength {
        ty: GgmlType,
        what: &'static str,
        n: usize,
        got: usize,
        need: usize,
    },
}

/// Calls `$body` with `$F` bound to the format type of `$ty`, or evaluates `$other`.
macro_rules! with_format {
    ($ty:expr, $F:ident => $body:expr, _ => $other:expr) => {
        match $ty {
            GgmlType::F32 => {
                type $F = F32;
                $body
            }
            GgmlType::F16 => {
                type $F = F16;
                $body
            }
            GgmlType::Bf16 => {
                type $F = Bf16;
                $body
            }
            GgmlType::Q4_0 => {
                type $F = Q4_0;
                $body
            }
            GgmlType::Q4_1 => {
                type $F = Q4_1;
                $body
            }
            GgmlType::Q5_0 => {
                type $F = Q5_0;
                $body
            }
            GgmlType::Q5_1 => {
                type $F = Q5_1;
                $body
            }
            GgmlType::Q8_0 => {
                type $F = Q8_0;
                $body
            }
            GgmlType::Q8_1 => {
                type $F = Q8_1;
                $body
            }
            GgmlType::Q2K => {
                type $F = Q2K;
                $body
            }
            GgmlType::Q3K => {
                type $F = Q3K;
                $body
            }
            GgmlType::Q4K => {
                type $F = Q4K;
                $body
            }
            GgmlType::Q5K => {
                type $F = Q5K;
                $body
            }
            GgmlType::Q6K => {
                type $F = Q6K;
                $body
            }
            GgmlType::Q8K => {
                type $F = Q8K;
                $body
            }
            _ => $other,
        }
    };
}

/// The types the engine computes with (the others can be read and inspected, not used).
pub const SUPPORTED: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::Q8K,
];

/// The activation type a weight type's vec_dot pairs with (ggml's `vec_dot_type`).
pub fn vec_dot_type(ty: GgmlType) -> Result<GgmlType, QuantError> {
    with_format!(ty, F => Ok(<F as Format>::Dot::TYPE), _ => Err(QuantError::Unsupported(ty)))
}

fn blocks<'a, F: Format>(
    bytes: &'a [u8],
    n: usize,
    what: &'static str,
) -> Result<&'a [F::Block], QuantError> {
    let need = check_len::<F>(bytes.len(), n, what)?;
    Ok(bytemuck::cast_slice(&bytes[..need]))
}

fn blocks_mut<'a, F: Format>(
    bytes: &'a mut [u8],
    n: usize,
    what: &'static str,
) -> Result<&'a mut [F::Block], QuantError> {
    let need = check_len::<F>(bytes.len(), n, what)?;
    Ok(bytemuck::cast_slice_mut(&mut bytes[..need]))
}

/// Bytes of `n` elements of `F`, checking `n` is whole blocks and `got` is exactly that.
fn check_len<F: Format>(got: usize, n: usize, what: &'static str) -> Result<usize, QuantError> {
    if !n.is_multiple_of(F::QK) {
        return Err(QuantError::PartialBlock {
            ty: F::TYPE,
            n,
            qk: F::QK,
        });
    }
    let need = n / F::QK * std::mem::size_of::<F::Block>();
    if got != need {
        return Err(QuantError::WrongLength {
            ty: F::TYPE,
            what,
            n,
            got,
            need,
        });
    }
    Ok(need)
}

/// Dequantizes a row of `dst.len()` elements of type `ty` stored in `src`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    with_format!(ty, F => {
        let b = blocks::<F>(src, dst.len(), "source")?;
        dequantize_ref::<F>(b, dst);
        Ok(())
    }, _ => Err(QuantError::Unsupported(ty)))
}

/// True if [`quantize_row`] can write `ty`.
pub fn has_quantizer(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::F32
            | GgmlType::F16
            | GgmlType::Bf16
            | GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::Q2K
            | GgmlType::Q3K
            | GgmlType::Q4K
            | GgmlType::Q5K
            | GgmlType::Q6K
            | GgmlType::Q8K
    )
}

/// Quantizes `src` into `dst` as type `ty`.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    macro_rules! q {
        ($F:ty) => {{
            let b = blocks_mut::<$F>(dst, src.len(), "destination")?;
            quantize_ref::<$F>(src, b);
            Ok(())
        }};
    }
    match ty {
        GgmlType::F32 => q!(F32),
        GgmlType::F16 => q!(F16),
        GgmlType::Bf16 => q!(Bf16),
        GgmlType::Q4_0 => q!(Q4_0),
        GgmlType::Q4_1 => q!(Q4_1),
        GgmlType::Q5_0 => q!(Q5_0),
        GgmlType::Q5_1 => q!(Q5_1),
        GgmlType::Q8_0 => q!(Q8_0),
        GgmlType::Q8_1 => q!(Q8_1),
        GgmlType::Q2K => q!(Q2K),
        GgmlType::Q3K => q!(Q3K),
        GgmlType::Q4K => q!(Q4K),
        GgmlType::Q5K => q!(Q5K),
        GgmlType::Q6K => q!(Q6K),
        GgmlType::Q8K => q!(Q8K),
        _ => Err(QuantError::Unsupported(ty)),
    }
}

/// Quantizes activations for a dot product the way ggml's x86 SIMD path does at run time
/// (`quantize_row_q8_0`/`q8_1` with AVX2): the same blocks as [`quantize_row`] except that the
/// inverse scale is `127 / amax` and values round half to even. Weights in files come from the
/// reference quantizer; activations of a running model come from this one, which is what makes
/// dot products (and so greedy text) agree with llama.cpp to the last bit. Other types are
/// quantized by [`quantize_row`].
pub fn quantize_activations(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    fn q8(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        let mut sum = 0;
        for (q, &v) in qs.iter_mut().zip(x) {
            *q = (v * id).round_ties_even() as i8;
            sum += i32::from(*q);
        }
        (amax / 127.0, sum)
    }
    match ty {
        GgmlType::Q8_0 => {
            let blocks = blocks_mut::<Q8_0>(dst, src.len(), "destination")?;
            for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
                let (d, _) = q8(x, &mut b.qs);
                b.d = half::F16Le::from_f32(d);
            }
            Ok(())
        }
        GgmlType::Q8_1 => {
            let blocks = blocks_mut::<Q8_1>(dst, src.len(), "destination")?;
            for (x, b) in src.chunks_exact(32).zip(blocks.iter_mut()) {
                let (d, sum) = q8(x, &mut b.qs);
                b.d = half::F16Le::from_f32(d);
                b.s = half::F16Le::from_f32(d * sum as f32);
            }
            Ok(())
        }
        _ => quantize_row(ty, src, dst),
    }
}

/// Dot product of `n` elements: `x` of type `ty`, `y` of `vec_dot_type(ty)`.
pub fn vec_dot(ty: GgmlType, n: usize, x: &[u8], y: &[u8]) -> Result<f32, QuantError> {
    with_format!(ty, F => {
        let xb = blocks::<F>(x, n, "x")?;
        let yb = blocks::<<F as Format>::Dot>(y, n, "y")?;
        Ok(vec_dot_ref::<F>(xb, yb))
    }, _ => Err(QuantError::Unsupported(ty)))
}

/// Bytes that `n` elements of `ty` occupy.
pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize, QuantError> {
    fn of<F: Format>(n: usize) -> Result<usize, QuantError> {
        if !n.is_multiple_of(F::QK) {
            return Err(QuantError::PartialBlock {
                ty: F::TYPE,
                n,
                qk: F::QK,
            });
        }
        Ok(n / F::QK * std::mem::size_of::<F::Block>())
    }
    with_format!(ty, F => of::<F>(n), _ => Err(QuantError::Unsupported(ty)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_agree_with_the_file_format_table() {
        for ty in SUPPORTED {
            let l = ty.layout();
            assert_eq!(
                row_bytes(ty, l.block_elems as usize).unwrap() as u64,
                l.block_bytes,
                "{ty}"
            );
        }
    }
}
