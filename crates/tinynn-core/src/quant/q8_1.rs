//! Q8_1: Q8_0 plus `s = d * Σq`, so formats with a minimum (Q4_1, Q5_1) can fold it in.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::F16Le;
use super::q8_0::{dot_i8, quantize_32};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: F16Le,
    /// `d * Σ qs`.
    pub s: F16Le,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_1>() == 36);

pub struct Q8_1;

impl Format for Q8_1 {
    const TYPE: GgmlType = GgmlType::Q8_1;
    const QK: usize = 32;
    type Block = BlockQ8_1;
    type Dot = Q8_1;

    fn dequantize_block(b: &BlockQ8_1, out: &mut [f32]) {
        let d = b.d.get();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    }

    fn vec_dot_block(x: &BlockQ8_1, y: &BlockQ8_1) -> f32 {
        dot_i8(&x.qs, &y.qs) as f32 * (x.d.get() * y.d.get())
    }
}

impl Quantize for Q8_1 {
    fn quantize_block(x: &[f32], out: &mut BlockQ8_1) {
        let (d, sum) = quantize_32(x, &mut out.qs);
        out.d = F16Le::from_f32(d);
        out.s = F16Le::from_f32(sum as f32 * d);
    }
}
