//! Q3_K: 3-bit values (2 low bits in `qs`, the high bit in `hmask`, stored inverted: a clear bit
//! subtracts 4), 16 sub-blocks of 16 with signed 6-bit scales and no minimum.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::Format;
use super::half::F16Le;
use super::k_common::{KUnpacked, QK_K};
use super::q8_k::{BlockQ8K, Q8K};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; 32],
    pub qs: [u8; 64],
    /// 16 scales of 6 bits: low 4 bits in bytes 0..8 (two per byte), high 2 bits in bytes 8..12.
    pub scales: [u8; 12],
    pub d: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

pub struct Q3K;

impl Q3K {
    pub fn unpack(b: &BlockQ3K) -> KUnpacked {
        let mut u = KUnpacked::new(b.d.get(), 0.0, 16);
        let s = &b.scales;
        for i in 0..16 {
            let low = if i < 8 { s[i] & 0x0F } else { s[i - 8] >> 4 };
            let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            u.scales[i] = i32::from(low | (high << 4)) - 32;
        }
        for i in 0..QK_K {
            let (half, within) = (i / 128, i % 128);
            let (pass, l) = (within / 32, within % 32);
            let low = (b.qs[half * 32 + l] >> (2 * pass)) & 3;
            let high_set = b.hmask[l] & (1 << (half * 4 + pass)) != 0;
            u.q[i] = low as i8 - if high_set { 0 } else { 4 };
        }
        u
    }
}

impl Format for Q3K {
    const TYPE: GgmlType = GgmlType::Q3K;
    const QK: usize = QK_K;
    type Block = BlockQ3K;
    type Dot = Q8K;

    fn dequantize_block(b: &BlockQ3K, out: &mut [f32]) {
        Q3K::unpack(b).dequantize(out);
    }

    fn vec_dot_block(x: &BlockQ3K, y: &BlockQ8K) -> f32 {
        Q3K::unpack(x).vec_dot(y)
    }
}
