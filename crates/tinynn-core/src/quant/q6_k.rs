//! Q6_K: 6-bit values with offset 32 (low 4 bits in `ql`, high 2 in `qh`), 16 sub-blocks of 16
//! with signed 8-bit scales.

use bytemuck::{Pod, Zeroable};
use tinynn_format::GgmlType;

use super::format::{Format, Quantize};
use super::half::F16Le;
use super::k_common::{KUnpacked, QK_K};
use super::k_quantize::{make_qx_quants, nearest_int, GROUP_MAX_EPS};
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

/// ggml's `quantize_row_q6_K_ref`, bit for bit.
///
/// Each sub-block of 16 gets a signed scale from `make_qx_quants` (`l ∈ −32..32`, weights `x²`,
/// 19 candidate scales). The scales are quantized to i8 against the one of largest magnitude
/// (`d = −max_scale / 128`, f16), then every value is re-quantized against the stored scale,
/// `l = round(x / (d·sc))` clamped to `−32..=31` (a sub-block whose `d·sc` is 0 keeps the
/// search's `l`). A block whose scales are all below `GROUP_MAX_EPS` is all zero bytes.
impl Quantize for Q6K {
    fn quantize_block(x: &[f32], out: &mut BlockQ6K) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for (ib, s) in scales.iter_mut().enumerate() {
            let range = 16 * ib..16 * (ib + 1);
            *s = make_qx_quants(32, &x[range.clone()], &mut l[range]);
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = *s;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *out = bytemuck::Zeroable::zeroed();
            return;
        }

        let iscale = -128.0 / max_scale;
        out.d = F16Le::from_f32(1.0 / iscale);
        for (o, &s) in out.scales.iter_mut().zip(&scales) {
            // C converts MIN(127, nearest_int(..)) to int8_t (truncating), as `as i8` does.
            *o = nearest_int(iscale * s).min(127) as i8;
        }
        let d_f = out.d.get();
        for (j, &sc) in out.scales.iter().enumerate() {
            let dj = d_f * f32::from(sc);
            if dj == 0.0 {
                continue;
            }
            for i in 16 * j..16 * (j + 1) {
                l[i] = (nearest_int(x[i] / dj).clamp(-32, 31) + 32) as i8;
            }
        }

        // Inverse of `unpack`: per 128-element half, nibbles of elements l, l+32 (low) and
        // l+64, l+96 (high) in ql, and the 2 high bits of all four in qh[l].
        for (h, l) in l.chunks_exact(128).enumerate() {
            let ql = &mut out.ql[64 * h..64 * (h + 1)];
            let qh = &mut out.qh[32 * h..32 * (h + 1)];
            for i in 0..32 {
                let q = [0, 32, 64, 96].map(|k| l[i + k] as u8);
                ql[i] = (q[0] & 0x0F) | ((q[2] & 0x0F) << 4);
                ql[i + 32] = (q[1] & 0x0F) | ((q[3] & 0x0F) << 4);
                qh[i] = (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
            }
        }
    }
}
