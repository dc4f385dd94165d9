//! Q2_K: 2-bit values, 16 sub-blocks of 16 with 4-bit scales and 4-bit minimums.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::F16Le;
use super::k_common::{KUnpacked, QK_K};
use super::k_quantize::{f16_round, make_qkx2_quants, nearest_int, pack_2bit, Qkx2};
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

/// ggml's `quantize_row_q2_K_ref`, bit for bit.
///
/// Each sub-block of 16 is fitted as `scale·l − min` (`l ∈ 0..=3`) by `make_qkx2_quants` with
/// weights `|x|` and the weighted-|error| metric. The 16 scales and 16 mins are quantized to
/// 4 bits against the largest of each (`d = max_scale / 15`, `dmin = max_min / 15`, f16), and
/// every value is then re-quantized against the stored scales:
/// `l = round((x + dmin·m) / (d·sc))`, clamped to `0..=3` (a sub-block whose `d·sc` is 0 keeps
/// the search's `l`).
impl Quantize for Q2K {
    fn quantize_block(x: &[f32], out: &mut BlockQ2K) {
        const Q4SCALE: f32 = 15.0;
        let search = Qkx2 {
            nmax: 3,
            rmin: -0.5,
            rdelta: 0.1,
            nstep: 15,
            use_mad: true,
        };
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        let mut weights = [0f32; 16];
        for j in 0..16 {
            let xs = &x[16 * j..16 * (j + 1)];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let ls = &mut l[16 * j..16 * (j + 1)];
            (scales[j], mins[j]) = make_qkx2_quants(&search, xs, &weights, ls);
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }

        // C stores each nearest_int result into a uint8_t (truncating), as `as u8` does.
        let mut sc = [0u8; 16];
        let d = if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (s, &v) in sc.iter_mut().zip(&scales) {
                *s = nearest_int(iscale * v) as u8;
            }
            max_scale / Q4SCALE
        } else {
            0.0
        };
        let dmin = if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (s, &v) in sc.iter_mut().zip(&mins) {
                *s |= (nearest_int(iscale * v) << 4) as u8;
            }
            max_min / Q4SCALE
        } else {
            0.0
        };
        let (d, d_f) = f16_round(d);
        let (dmin, dmin_f) = f16_round(dmin);

        for (j, &s) in sc.iter().enumerate() {
            let dj = d_f * f32::from(s & 0x0F);
            if dj == 0.0 {
                continue;
            }
            let dm = dmin_f * f32::from(s >> 4);
            for i in 16 * j..16 * (j + 1) {
                l[i] = nearest_int((x[i] + dm) / dj).clamp(0, 3) as u8;
            }
        }

        out.scales = sc;
        pack_2bit(&l, &mut out.qs);
        out.d = d;
        out.dmin = dmin;
    }
}
