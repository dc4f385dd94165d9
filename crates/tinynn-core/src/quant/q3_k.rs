//! Q3_K: 3-bit values (2 low bits in `qs`, the high bit in `hmask`, stored inverted: a clear bit
//! subtracts 4), 16 sub-blocks of 16 with signed 6-bit scales and no minimum.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::F16Le;
use super::k_common::{KUnpacked, QK_K};
use super::k_quantize::{make_q3_quants, nearest_int, pack_2bit};
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

/// ggml's `quantize_row_q3_K_ref`, bit for bit.
///
/// Each sub-block of 16 gets a signed scale from `make_q3_quants` (`l ∈ −4..4`, weights `x²`,
/// coordinate descent). The scales are quantized to 6 signed bits against the one of largest
/// magnitude (`d = −max_scale / 32`, f16), then every value is re-quantized against the stored
/// scale, `l = round(x / (d·sc))` clamped to `−4..=3` (a sub-block whose `d·sc` is 0 keeps the
/// search's `l`). `l + 4` is split into 2 low bits (`qs`) and the high bit (`hmask`).
impl Quantize for Q3K {
    fn quantize_block(x: &[f32], out: &mut BlockQ3K) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for (j, s) in scales.iter_mut().enumerate() {
            let range = 16 * j..16 * (j + 1);
            *s = make_q3_quants(4, &x[range.clone()], &mut l[range]);
            if s.abs() > amax {
                amax = s.abs();
                max_scale = *s;
            }
        }

        let mut packed = [0u8; 12];
        let d = if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                // C keeps nearest_int's result in an int8_t, then clamps and offsets it.
                let q = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    packed[j] = q & 0x0F;
                } else {
                    packed[j - 8] |= (q & 0x0F) << 4;
                }
                packed[8 + j % 4] |= (q >> 4) << (2 * (j / 4));
            }
            1.0 / iscale
        } else {
            0.0
        };
        out.d = F16Le::from_f32(d);
        let d_f = out.d.get();

        for j in 0..16 {
            let low = if j < 8 {
                packed[j] & 0x0F
            } else {
                packed[j - 8] >> 4
            };
            let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
            let sc = i32::from(low | (high << 4)) - 32;
            let dj = d_f * sc as f32;
            if dj == 0.0 {
                continue;
            }
            for i in 16 * j..16 * (j + 1) {
                l[i] = (nearest_int(x[i] / dj).clamp(-4, 3) + 4) as i8;
            }
        }

        // High bit of element j goes to bit j / 32 of hmask[j % 32].
        out.hmask = [0; 32];
        let mut low = [0u8; QK_K];
        for (j, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
            if q > 3 {
                out.hmask[j % 32] |= 1 << (j / 32);
                *lo = (q - 4) as u8;
            } else {
                *lo = q as u8;
            }
        }
        pack_2bit(&low, &mut out.qs);
        out.scales = packed;
    }
}
