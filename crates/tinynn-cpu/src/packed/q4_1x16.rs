//! Q4_1 × 16 rows. Group block (320 B): `d[16]` f16, `m[16]` f16, then for j in 0..4 the
//! 16 rows' quant bytes `4j..4j+4` (64 B). A byte's low nibble is element `i`, its high
//! nibble element `i + 16`, as in Q4_1. Row value = d·q + m; with activations `x = da·qa`
//! and `sa = da·Σqa`: dot = Σ_blocks d·da·Σ q·qa + m·sa.

use super::{f16_at, ACT_BLOCK_BYTES};

/// Writes row `r`'s Q4_1 block (20 B: d, m, 16 quant bytes) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    dst[32 + 2 * r..32 + 2 * r + 2].copy_from_slice(&src[2..4]);
    for j in 0..4 {
        dst[64 + 64 * j + 4 * r..][..4].copy_from_slice(&src[4 + 4 * j..][..4]);
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * 320..][..320];
        let xb = &x[b * ACT_BLOCK_BYTES..][..ACT_BLOCK_BYTES];
        let mut isum = 0i32;
        for j in 0..4 {
            for i in 0..4 {
                let byte = wb[64 + 64 * j + 4 * r + i];
                isum += i32::from(byte & 0x0F) * i32::from(xb[4 + 4 * j + i] as i8);
                isum += i32::from(byte >> 4) * i32::from(xb[20 + 4 * j + i] as i8);
            }
        }
        let (d, m) = (f16_at(&wb[2 * r..]), f16_at(&wb[32 + 2 * r..]));
        acc += isum as f32 * d * f16_at(xb) + m * f16_at(&xb[2..]);
    }
    acc
}

/// All `m` tokens against one group (see `PackedWeight::matmul_raw`).
///
/// # Safety
/// As `PackedWeight::matmul_raw`, for the group at `w` and the columns at `out`.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul_group(
    w: *const u8,
    nb: usize,
    acts: *const u8,
    act_stride: usize,
    m: usize,
    out: *mut f32,
    out_stride: usize,
    valid: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut t = 0;
        while t < m {
            let n = (m - t).min(8);
            // SAFETY: forwarded; tokens t..t+n exist.
            unsafe {
                let (x, o) = (acts.add(t * act_stride), out.add(t * out_stride));
                let f = match n {
                    8 => avx512::tile::<8>,
                    7 => avx512::tile::<7>,
                    6 => avx512::tile::<6>,
                    5 => avx512::tile::<5>,
                    4 => avx512::tile::<4>,
                    3 => avx512::tile::<3>,
                    2 => avx512::tile::<2>,
                    _ => avx512::tile::<1>,
                };
                f(w, nb, x, act_stride, o, out_stride, valid);
            }
            t += n;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // Never packed off x86 (see `packed::available`); the reference keeps this correct.
        for t in 0..m {
            // SAFETY: forwarded from the caller.
            unsafe {
                let w = std::slice::from_raw_parts(w, nb * 320);
                let x = std::slice::from_raw_parts(acts.add(t * act_stride), nb * ACT_BLOCK_BYTES);
                for r in 0..valid {
                    *out.add(t * out_stride + r) = dot_ref(w, nb, r, x);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `T` tokens × 16 rows over `nb` blocks.
    ///
    /// # Safety
    /// AVX-512 F/BW + VNNI + F16C present; pointers as in `matmul_group`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
    pub(super) unsafe fn tile<const T: usize>(
        w: *const u8,
        nb: usize,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let m4 = _mm512_set1_epi8(0x0F);
        let mut f = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            // SAFETY: block b of the group and of every token row is in bounds (caller).
            unsafe {
                let wb = w.add(b * 320);
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb as *const __m256i));
                let mn = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(32) as *const __m256i));
                let mut lo = [_mm512_setzero_si512(); 4];
                let mut hi = [_mm512_setzero_si512(); 4];
                for j in 0..4 {
                    let q = _mm512_loadu_si512(wb.add(64 + 64 * j) as *const __m512i);
                    lo[j] = _mm512_and_si512(q, m4);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                }
                for (t, ft) in f.iter_mut().enumerate() {
                    let xb = x.add(t * x_stride + b * 36);
                    let ds = _mm_cvtph_ps(_mm_cvtsi32_si128((xb as *const i32).read_unaligned()));
                    let mut acc = _mm512_setzero_si512();
                    for j in 0..4 {
                        let xl = (xb.add(4 + 4 * j) as *const i32).read_unaligned();
                        let xh = (xb.add(20 + 4 * j) as *const i32).read_unaligned();
                        acc = _mm512_dpbusd_epi32(acc, lo[j], _mm512_set1_epi32(xl));
                        acc = _mm512_dpbusd_epi32(acc, hi[j], _mm512_set1_epi32(xh));
                    }
                    let da = _mm512_broadcastss_ps(ds);
                    let sa = _mm512_broadcastss_ps(_mm_movehdup_ps(ds));
                    *ft = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, da), *ft);
                    *ft = _mm512_fmadd_ps(mn, sa, *ft);
                }
            }
        }
        let mask: __mmask16 = if valid >= 16 {
            0xFFFF
        } else {
            (1u16 << valid) - 1
        };
        for (t, ft) in f.iter().enumerate() {
            // SAFETY: the `valid` columns of token t's output row are this thread's (caller).
            unsafe { _mm512_mask_storeu_ps(out.add(t * out_stride), mask, *ft) };
        }
    }
}
