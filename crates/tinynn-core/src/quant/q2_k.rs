//! Q2_K: 2-bit values, 16 sub-blocks of 16 with 4-bit scales and 4-bit minimums.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::Format;
use super::half::F16Le;
use super::k_common::{KUnpacked, QK_K};
use super::q8_k::{BlockQ8K, Q8K};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    /// Low nibble: scale, high nibble: minimum, per sub-block.
    pub scales: [u8; 16],
    pub qs: [u8; 64],
    pub d: F16Le,
    pub dmin: F16Le,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

pub struct Q2K;

impl Q2K {
    /// Bits to values: each 128-element half reads 32 bytes four times, 2 bits at a time.
    pub fn unpack(b: &BlockQ2K) -> KUnpacked {
        let mut u = KUnpacked::new(b.d.get(), b.dmin.get(), 16);
        for (s, &sc) in b.scales.iter().enumerate() {
            u.scales[s] = i32::from(sc & 0x0F);
            u.mins[s] = i32::from(sc >> 4);
        }
        for i in 0..QK_K {
            let (half, within) = (i / 128, i % 128);
            let (shift, byte) = (2 * (within / 32), half * 32 + within % 32);
            u.q[i] = ((b.qs[byte] >> shift) & 3) as i8;
        }
        u
    }
}

impl Format for Q2K {
    const TYPE: GgmlType = GgmlType::Q2K;
    const QK: usize = QK_K;
    type Block = BlockQ2K;
    type Dot = Q8K;

    fn dequantize_block(b: &BlockQ2K, out: &mut [f32]) {
        Q2K::unpack(b).dequantize(out);
    }

    fn vec_dot_block(x: &BlockQ2K, y: &BlockQ8K) -> f32 {
        Q2K::unpack(x).vec_dot(y)
    }
}
