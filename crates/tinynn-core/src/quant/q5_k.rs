//! Q5_K: Q4_K's layout plus a fifth bit per value in `qh` (bit `2c` for the low half of chunk c,
//! bit `2c+1` for its high half).

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::F16Le;
use super::k_common::{scale_min_k4, KUnpacked, QK_K};
use super::k_quantize::{quantize_qkx_super_block, Qkx2};
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

/// ggml's `quantize_row_q5_K_ref`, bit for bit: the shared Q4_K/Q5_K super-block search
/// (`make_qkx2_quants` with `nmax = 31` and 16 candidate scales from `(31 − 0.5) / range` in
/// steps of 0.1), then 4 low bits in `qs` and the fifth bit in `qh`.
impl Quantize for Q5K {
    fn quantize_block(x: &[f32], out: &mut BlockQ5K) {
        let sb = quantize_qkx_super_block(
            x,
            &Qkx2 {
                nmax: 31,
                rmin: -0.5,
                rdelta: 0.1,
                nstep: 15,
                use_mad: false,
            },
        );
        out.d = sb.d;
        out.dmin = sb.dmin;
        out.scales = sb.scales;
        out.qh = [0; 32];
        for (c, (q, l)) in out
            .qs
            .chunks_exact_mut(32)
            .zip(sb.l.chunks_exact(64))
            .enumerate()
        {
            for i in 0..32 {
                let (lo, hi) = (l[i], l[i + 32]);
                out.qh[i] |= (lo >> 4) << (2 * c) | (hi >> 4) << (2 * c + 1);
                q[i] = (lo & 0x0F) | ((hi & 0x0F) << 4);
            }
        }
    }
}
