//! Q4_0: 32 values as 4-bit unsigned with offset 8 and one f16 scale (`x = d * (q - 8)`).
//! Element j of the block is the low nibble of `qs[j]` for j < 16, the high nibble of `qs[j-16]`.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{abs_max, inv_or_zero, Format, Quantize};
use super::half::F16Le;
use super::q8_0::{BlockQ8_0, Q8_0};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: F16Le,
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

pub struct Q4_0;

impl Format for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    const QK: usize = 32;
    type Block = BlockQ4_0;
    type Dot = Q8_0;

    fn dequantize_block(b: &BlockQ4_0, out: &mut [f32]) {
        let d = b.d.get();
        for (j, &q) in b.qs.iter().enumerate() {
            out[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
            out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }

    fn vec_dot_block(x: &BlockQ4_0, y: &BlockQ8_0) -> f32 {
        let mut sumi = 0i32;
        for (j, &q) in x.qs.iter().enumerate() {
            sumi += (i32::from(q & 0x0F) - 8) * i32::from(y.qs[j]);
            sumi += (i32::from(q >> 4) - 8) * i32::from(y.qs[j + 16]);
        }
        sumi as f32 * x.d.get() * y.d.get()
    }
}

impl Quantize for Q4_0 {
    fn quantize_block(x: &[f32], out: &mut BlockQ4_0) {
        let (_, max) = abs_max(x);
        let d = max / -8.0;
        let id = inv_or_zero(d);
        out.d = F16Le::from_f32(d);
        // C's (int8_t) cast truncates toward zero; the value is in [0.5, 16.5].
        let q = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..16 {
            out.qs[j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}
