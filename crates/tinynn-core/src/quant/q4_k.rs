//! Q4_K: 4-bit values, 8 sub-blocks of 32 with 6-bit scales and 6-bit minimums.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::F16Le;
use super::k_common::{scale_min_k4, KUnpacked, QK_K};
use super::k_quantize::{quantize_qkx_super_block, Qkx2};
use super::q8_k::{BlockQ8K, Q8K};

#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: F16Le,
    pub dmin: F16Le,
    pub scales: [u8; 12],
    /// Each 64-element chunk: 32 bytes, low nibbles first 32 elements, high nibbles the next 32.
    pub qs: [u8; 128],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

pub struct Q4K;

impl Q4K {
    pub fn unpack(b: &BlockQ4K) -> KUnpacked {
        let mut u = KUnpacked::new(b.d.get(), b.dmin.get(), 32);
        for j in 0..8 {
            (u.scales[j], u.mins[j]) = scale_min_k4(j, &b.scales);
        }
        for i in 0..QK_K {
            let (chunk, within) = (i / 64, i % 64);
            let byte = b.qs[chunk * 32 + within % 32];
            u.q[i] = if within < 32 { byte & 0x0F } else { byte >> 4 } as i8;
        }
        u
    }
}

impl Format for Q4K {
    const TYPE: GgmlType = GgmlType::Q4K;
    const QK: usize = QK_K;
    type Block = BlockQ4K;
    type Dot = Q8K;

    fn dequantize_block(b: &BlockQ4K, out: &mut [f32]) {
        Q4K::unpack(b).dequantize(out);
    }

    fn vec_dot_block(x: &BlockQ4K, y: &BlockQ8K) -> f32 {
        Q4K::unpack(x).vec_dot(y)
    }
}

/// ggml's `quantize_row_q4_K_ref`, bit for bit: the shared Q4_K/Q5_K super-block search
/// (`make_qkx2_quants` with `nmax = 15` and 21 candidate scales from `(15 − 1) / range` in steps
/// of 0.1), then 4-bit packing.
impl Quantize for Q4K {
    fn quantize_block(x: &[f32], out: &mut BlockQ4K) {
        let sb = quantize_qkx_super_block(
            x,
            &Qkx2 {
                nmax: 15,
                rmin: -1.0,
                rdelta: 0.1,
                nstep: 20,
                use_mad: false,
            },
        );
        out.d = sb.d;
        out.dmin = sb.dmin;
        out.scales = sb.scales;
        for (q, l) in out.qs.chunks_exact_mut(32).zip(sb.l.chunks_exact(64)) {
            for i in 0..32 {
                q[i] = l[i] | (l[i + 32] << 4);
            }
        }
    }
}
