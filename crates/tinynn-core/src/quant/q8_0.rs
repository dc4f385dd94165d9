//! Q8_0: 32 values as i8 with one f16 scale. Also the activation format of Q4_0, Q5_0, Q8_0.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{abs_max, inv_or_zero, Format, Quantize};
use super::half::F16Le;

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: F16Le,
    pub qs: [i8; 32],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

pub struct Q8_0;

impl Format for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    const QK: usize = 32;
    type Block = BlockQ8_0;
    type Dot = Q8_0;

    fn dequantize_block(b: &BlockQ8_0, out: &mut [f32]) {
        let d = b.d.get();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    }

    fn vec_dot_block(x: &BlockQ8_0, y: &BlockQ8_0) -> f32 {
        let sumi: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum();
        sumi as f32 * (x.d.get() * y.d.get())
    }
}

impl Quantize for Q8_0 {
    fn quantize_block(x: &[f32], out: &mut BlockQ8_0) {
        let (amax, _) = abs_max(x);
        let d = amax / 127.0;
        let id = inv_or_zero(d);
        out.d = F16Le::from_f32(d);
        for (q, &v) in out.qs.iter_mut().zip(x) {
            // C's roundf: halves away from zero.
            *q = (v * id).round() as i8;
        }
    }
}
