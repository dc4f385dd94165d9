//! Q6_K: 6-bit values with offset 32 (low 4 bits in `ql`, high 2 in `qh`), 16 sub-blocks of 16
//! with signed 8-bit scales.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::Format;
use super::half::F16Le;
use super::k_common::{KUnpacked, QK_K};
use super::q8_k::{BlockQ8K, Q8K};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; 128],
    pub qh: [u8; 64],
    pub scales: [i8; 16],
    pub d: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

pub struct Q6K;

impl Q6K {
    /// Each 128-element half uses 64 bytes of `ql` and 32 of `qh`; within it, element
    /// `32k + l` takes nibble `k / 2` of `ql[l + 32 (k % 2)]` and bits `2k..2k+2` of `qh[l]`.
    pub fn unpack(b: &BlockQ6K) -> KUnpacked {
        let mut u = KUnpacked::new(b.d.get(), 0.0, 16);
        for (s, &sc) in b.scales.iter().enumerate() {
            u.scales[s] = i32::from(sc);
        }
        for i in 0..QK_K {
            let (half, within) = (i / 128, i % 128);
            let (k, l) = (within / 32, within % 32);
            let lbyte = b.ql[half * 64 + l + 32 * (k % 2)];
            let low = if k < 2 { lbyte & 0x0F } else { lbyte >> 4 };
            let high = (b.qh[half * 32 + l] >> (2 * k)) & 3;
            u.q[i] = (low | (high << 4)) as i8 - 32;
        }
        u
    }
}

impl Format for Q6K {
    const TYPE: GgmlType = GgmlType::Q6K;
    const QK: usize = QK_K;
    type Block = BlockQ6K;
    type Dot = Q8K;

    fn dequantize_block(b: &BlockQ6K, out: &mut [f32]) {
        Q6K::unpack(b).dequantize(out);
    }

    fn vec_dot_block(x: &BlockQ6K, y: &BlockQ8K) -> f32 {
        Q6K::unpack(x).vec_dot(y)
    }
}
