//! The float formats as one-element "blocks": F32, F16, BF16 (each its own activation format).

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};

/// A little-endian scalar of `N` bytes (byte-aligned, so any slice of a file can be viewed).
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(transparent)]
pub struct Le<const N: usize>(pub [u8; N]);

pub struct F32;
pub struct F16;
pub struct Bf16;

macro_rules! float_format {
    ($fmt:ident, $ty:expr, $n:literal, $to:expr, $from:expr) => {
        impl Format for $fmt {
            const TYPE: GgmlType = $ty;
            const QK: usize = 1;
            type Block = Le<$n>;
            type Dot = $fmt;

            fn dequantize_block(b: &Le<$n>, out: &mut [f32]) {
                out[0] = $to(b.0);
            }

            fn vec_dot_block(x: &Le<$n>, y: &Le<$n>) -> f32 {
                $to(x.0) * $to(y.0)
            }
        }

        impl Quantize for $fmt {
            fn quantize_block(x: &[f32], out: &mut Le<$n>) {
                out.0 = $from(x[0]);
            }
        }
    };
}

float_format!(F32, GgmlType::F32, 4, f32::from_le_bytes, |x: f32| x
    .to_le_bytes());
float_format!(
    F16,
    GgmlType::F16,
    2,
    |b| f16_to_f32(u16::from_le_bytes(b)),
    |x| f32_to_f16(x).to_le_bytes()
);
float_format!(
    Bf16,
    GgmlType::Bf16,
    2,
    |b| bf16_to_f32(u16::from_le_bytes(b)),
    |x| f32_to_bf16(x).to_le_bytes()
);
