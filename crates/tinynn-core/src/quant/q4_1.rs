//! Q4_1: 32 values as 4-bit unsigned with an f16 scale and an f16 minimum (`x = d * q + m`).

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{inv_or_zero, Format, Quantize};
use super::half::F16Le;
use super::q8_1::{BlockQ8_1, Q8_1};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

pub struct Q4_1;

/// The block's minimum and maximum, as ggml scans them (starting from ±FLT_MAX).
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| {
        (if v < lo { v } else { lo }, if v > hi { v } else { hi })
    })
}

impl Format for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    const QK: usize = 32;
    type Block = BlockQ4_1;
    type Dot = Q8_1;

    fn dequantize_block(b: &BlockQ4_1, out: &mut [f32]) {
        let (d, m) = (b.d.get(), b.m.get());
        for (j, &q) in b.qs.iter().enumerate() {
            out[j] = f32::from(q & 0x0F) * d + m;
            out[j + 16] = f32::from(q >> 4) * d + m;
        }
    }

    fn vec_dot_block(x: &BlockQ4_1, y: &BlockQ8_1) -> f32 {
        let mut sumi = 0i32;
        for (j, &q) in x.qs.iter().enumerate() {
            sumi += i32::from(q & 0x0F) * i32::from(y.qs[j]);
            sumi += i32::from(q >> 4) * i32::from(y.qs[j + 16]);
        }
        (x.d.get() * y.d.get()) * sumi as f32 + x.m.get() * y.s.get()
    }
}

impl Quantize for Q4_1 {
    fn quantize_block(x: &[f32], out: &mut BlockQ4_1) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inv_or_zero(d);
        out.d = F16Le::from_f32(d);
        out.m = F16Le::from_f32(min);
        let q = |v: f32| (((v - min) * id + 0.5) as i8).min(15) as u8;
        for j in 0..16 {
            out.qs[j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}
