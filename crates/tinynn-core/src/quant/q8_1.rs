//! Q8_1: Q8_0 plus `s = d * Σq`, so formats with a minimum (Q4_1, Q5_1) can fold it in.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{abs_max, inv_or_zero, Format, Quantize};
use super::half::F16Le;

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
        let sumi: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum();
        sumi as f32 * (x.d.get() * y.d.get())
    }
}

impl Quantize for Q8_1 {
    fn quantize_block(x: &[f32], out: &mut BlockQ8_1) {
        let (amax, _) = abs_max(x);
        let d = amax / 127.0;
        let id = inv_or_zero(d);
        out.d = F16Le::from_f32(d);
        let mut sum = 0i32;
        for (q, &v) in out.qs.iter_mut().zip(x) {
            *q = (v * id).round() as i8;
            sum += i32::from(*q);
        }
        out.s = F16Le::from_f32(sum as f32 * d);
    }
}
