//! Q5_1: 32 values as 5-bit unsigned with an f16 scale and minimum (`x = d * q + m`).

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{inv_or_zero, Format, Quantize};
use super::half::F16Le;
use super::q4_1::min_max;
use super::q5_0::{pack5, unpack5};
use super::q8_1::{BlockQ8_1, Q8_1};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: F16Le,
    pub m: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

pub struct Q5_1;

impl Format for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    const QK: usize = 32;
    type Block = BlockQ5_1;
    type Dot = Q8_1;

    fn dequantize_block(b: &BlockQ5_1, out: &mut [f32]) {
        let (d, m) = (b.d.get(), b.m.get());
        for (o, q) in out.iter_mut().zip(unpack5(b.qh, &b.qs)) {
            *o = f32::from(q) * d + m;
        }
    }

    fn vec_dot_block(x: &BlockQ5_1, y: &BlockQ8_1) -> f32 {
        let q = unpack5(x.qh, &x.qs);
        let sumi: i32 = q
            .iter()
            .zip(&y.qs)
            .map(|(&a, &b)| i32::from(a) * i32::from(b))
            .sum();
        (x.d.get() * y.d.get()) * sumi as f32 + x.m.get() * y.s.get()
    }
}

impl Quantize for Q5_1 {
    fn quantize_block(x: &[f32], out: &mut BlockQ5_1) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inv_or_zero(d);
        out.d = F16Le::from_f32(d);
        out.m = F16Le::from_f32(min);
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (((v - min) * id + 0.5) as i8).min(31) as u8;
        }
        pack5(&q, &mut out.qh, &mut out.qs);
    }
}
