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

/// Round-to-nearest 8-bit quantization of 32 values as ggml's reference does it (`amax / 127`,
/// halves away from zero); returns the scale and the sum of the quants (shared with Q8_1).
pub(crate) fn quantize_32(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let (amax, _) = abs_max(x);
    let d = amax / 127.0;
    let id = inv_or_zero(d);
    let mut sum = 0;
    for (q, &v) in qs.iter_mut().zip(x) {
        // C's roundf: halves away from zero.
        *q = (v * id).round() as i8;
        sum += i32::from(*q);
    }
    (d, sum)
}

/// `Σ a·b` of two rows of i8 quants (shared with Q8_1).
pub(crate) fn dot_i8(a: &[i8; 32], b: &[i8; 32]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

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
        dot_i8(&x.qs, &y.qs) as f32 * (x.d.get() * y.d.get())
    }
}

impl Quantize for Q8_0 {
    fn quantize_block(x: &[f32], out: &mut BlockQ8_0) {
        let (d, _) = quantize_32(x, &mut out.qs);
        out.d = F16Le::from_f32(d);
    }
}
