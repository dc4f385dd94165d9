//! Q5_0: 32 values as 5-bit unsigned with offset 16 and an f16 scale (`x = d * (q - 16)`).
//! The low 4 bits are packed as in Q4_0; bit 4 of element j is bit j of the little-endian `qh`.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{abs_max, inv_or_zero, Format, Quantize};
use super::half::F16Le;
use super::q8_0::{BlockQ8_0, Q8_0};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: F16Le,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

pub struct Q5_0;

/// The 5-bit values of a Q5 block's 32 elements (shared with Q5_1).
pub(crate) fn unpack5(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for j in 0..16 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

/// Packs 32 five-bit values into `qh` and `qs` (shared with Q5_1).
pub(crate) fn pack5(q: &[u8; 32], qh: &mut [u8; 4], qs: &mut [u8; 16]) {
    let mut h = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        h |= u32::from(q[j] >> 4) << j;
        h |= u32::from(q[j + 16] >> 4) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

impl Format for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    const QK: usize = 32;
    type Block = BlockQ5_0;
    type Dot = Q8_0;

    fn dequantize_block(b: &BlockQ5_0, out: &mut [f32]) {
        let d = b.d.get();
        for (o, q) in out.iter_mut().zip(unpack5(b.qh, &b.qs)) {
            *o = (i32::from(q) - 16) as f32 * d;
        }
    }

    fn vec_dot_block(x: &BlockQ5_0, y: &BlockQ8_0) -> f32 {
        let q = unpack5(x.qh, &x.qs);
        let sumi: i32 = q
            .iter()
            .zip(&y.qs)
            .map(|(&a, &b)| (i32::from(a) - 16) * i32::from(b))
            .sum();
        sumi as f32 * x.d.get() * y.d.get()
    }
}

impl Quantize for Q5_0 {
    fn quantize_block(x: &[f32], out: &mut BlockQ5_0) {
        let (_, max) = abs_max(x);
        let d = max / -16.0;
        let id = inv_or_zero(d);
        out.d = F16Le::from_f32(d);
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * id + 16.5) as i8).min(31) as u8;
        }
        pack5(&q, &mut out.qh, &mut out.qs);
    }
}
