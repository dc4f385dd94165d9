//! Q8_K: 256 values as i8 with an f32 scale and the sums of each group of 16 (the activation
//! format of every K-quant).

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{abs_max, Format, Quantize};
use super::half::nearest_int;
use super::k_common::QK_K;

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    /// Sums of `qs` in groups of 16, little-endian i16.
    pub bsums: [[u8; 2]; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ8K>() == 292);

impl BlockQ8K {
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }

    pub fn bsum(&self, i: usize) -> i16 {
        i16::from_le_bytes(self.bsums[i])
    }
}

pub struct Q8K;

impl Format for Q8K {
    const TYPE: GgmlType = GgmlType::Q8K;
    const QK: usize = QK_K;
    type Block = BlockQ8K;
    type Dot = Q8K;

    fn dequantize_block(b: &BlockQ8K, out: &mut [f32]) {
        let d = b.d();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = d * f32::from(q);
        }
    }

    fn vec_dot_block(x: &BlockQ8K, y: &BlockQ8K) -> f32 {
        let sumi: i32 =
            x.qs.iter()
                .zip(&y.qs)
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum();
        sumi as f32 * x.d() * y.d()
    }
}

impl Quantize for Q8K {
    fn quantize_block(x: &[f32], out: &mut BlockQ8K) {
        let (amax, max) = abs_max(x);
        if amax == 0.0 {
            *out = BlockQ8K::zeroed();
            return;
        }
        let iscale = -127.0 / max;
        for (q, &v) in out.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (g, sum) in out.bsums.iter_mut().enumerate() {
            let s: i32 = out.qs[g * 16..(g + 1) * 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            *sum = (s as i16).to_le_bytes();
        }
        out.d = (1.0 / iscale).to_le_bytes();
    }
}
