//! Q5_K: Q4_K's layout plus a fifth bit per value in `qh` (bit `2c` for the low half of chunk c,
//! bit `2c+1` for its high half).

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::Format;
use super::half::F16Le;
use super::k_common::{scale_min_k4, KUnpacked, QK_K};
use super::q8_k::{BlockQ8K, Q8K};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    pub qh: [u8; 32],
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

pub struct Q5K;

impl Q5K {
    pub fn unpack(b: &BlockQ5K) -> KUnpacked {
        let mut u = KUnpacked::new(b.d.get(), b.dmin.get(), 32);
        for j in 0..8 {
            (u.scales[j], u.mins[j]) = scale_min_k4(j, &b.scales);
        }
        for i in 0..QK_K {
            let (chunk, within) = (i / 64, i % 64);
            let l = within % 32;
            let byte = b.qs[chunk * 32 + l];
            let (low, bit) = if within < 32 {
                (byte & 0x0F, 2 * chunk)
            } else {
                (byte >> 4, 2 * chunk + 1)
            };
            let high = (b.qh[l] >> bit) & 1;
            u.q[i] = (low | (high << 4)) as i8;
        }
        u
    }
}

impl Format for Q5K {
    const TYPE: GgmlType = GgmlType::Q5K;
    const QK: usize = QK_K;
    type Block = BlockQ5K;
    type Dot = Q8K;

    fn dequantize_block(b: &BlockQ5K, out: &mut [f32]) {
        Q5K::unpack(b).dequantize(out);
    }

    fn vec_dot_block(x: &BlockQ5K, y: &BlockQ8K) -> f32 {
        Q5K::unpack(x).vec_dot(y)
    }
}
