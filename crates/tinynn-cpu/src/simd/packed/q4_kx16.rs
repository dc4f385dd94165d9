//! Q4_K × 16 rows, one 256-element super-block at a time (2368 B a group block):
//!
//! ```text
//! 0     d[16]     f16      the rows' super-block scales
//! 32    dmin[16]  f16      the rows' super-block min scales
//! 64    sc[8][16] u8       sub-block j's 6-bit scale of row r at 64 + 16j + r
//! 192   m[8][16]  u8       sub-block j's 6-bit min, likewise
//! 320   q[4][8]   64 B     pair p (elements 64p..64p+64), chunk c: bytes 32p+4c..+4 of the
//!                          file's `qs` for each of the 16 rows (low nibble: element 64p+4c+i,
//!                          high nibble: element 64p+32+4c+i)
//! ```
//!
//! Row value = `d·sc_j·q − dmin·m_j` for element `i` of sub-block `j`. With Q8_K activations
//! (`x = da·qa`, 16-value sums `bs`), as ggml's `vec_dot_q4_K_q8_K`:
//! dot = Σ_superblocks `da·d·Σ_j sc_j·Σ q·qa − da·dmin·Σ_j m_j·(bs_2j + bs_2j+1)`.

use super::{f16_at, Q8K_BLOCK_BYTES};

/// Bytes of a group block.
pub(super) const BLOCK_BYTES: usize = Q_AT + 2048;
const DMIN_AT: usize = 32;
const SC_AT: usize = 64;
const M_AT: usize = 192;
const Q_AT: usize = 320;

/// The 6-bit scale and min of sub-block `j` from the file's 12 packed bytes.
fn scale_min(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Writes row `r`'s Q4_K super-block (144 B: d, dmin, 12 scale bytes, 128 quant bytes).
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..][..2].copy_from_slice(&src[0..2]);
    dst[DMIN_AT + 2 * r..][..2].copy_from_slice(&src[2..4]);
    for j in 0..8 {
        let (sc, m) = scale_min(j, &src[4..16]);
        dst[SC_AT + 16 * j + r] = sc;
        dst[M_AT + 16 * j + r] = m;
    }
    let qs = &src[16..144];
    for p in 0..4 {
        for c in 0..8 {
            dst[Q_AT + 64 * (8 * p + c) + 4 * r..][..4].copy_from_slice(&qs[32 * p + 4 * c..][..4]);
        }
    }
}

/// The inverse of [`pack_block`]: row `r`'s file super-block.
pub(super) fn unpack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[0..2].copy_from_slice(&src[2 * r..][..2]);
    dst[2..4].copy_from_slice(&src[DMIN_AT + 2 * r..][..2]);
    let sc = |j: usize| src[SC_AT + 16 * j + r];
    let m = |j: usize| src[M_AT + 16 * j + r];
    let s = &mut dst[4..16];
    for j in 0..4 {
        s[j] = sc(j) | ((sc(j + 4) >> 4) << 6);
        s[j + 4] = m(j) | ((m(j + 4) >> 4) << 6);
        s[j + 8] = (sc(j + 4) & 0x0F) | ((m(j + 4) & 0x0F) << 4);
    }
    for p in 0..4 {
        for c in 0..8 {
            dst[16 + 32 * p + 4 * c..][..4]
                .copy_from_slice(&src[Q_AT + 64 * (8 * p + c) + 4 * r..][..4]);
        }
    }
}

/// Row `r` of a group (`nb` super-blocks at `w`) · Q8_K activation row `x`.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * BLOCK_BYTES..][..BLOCK_BYTES];
        let xb = &x[b * Q8K_BLOCK_BYTES..][..Q8K_BLOCK_BYTES];
        let da = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        let qa = |e: usize| i32::from(xb[4 + e] as i8);
        let bs = |i: usize| i32::from(i16::from_le_bytes([xb[260 + 2 * i], xb[261 + 2 * i]]));
        let (mut sum_q, mut sum_m) = (0i32, 0i32);
        for j in 0..8 {
            let (p, high) = (j / 2, j % 2 == 1);
            let mut dot = 0i32;
            for i in 0..32 {
                let byte = wb[Q_AT + 64 * (8 * p + i / 4) + 4 * r + i % 4];
                let q = if high { byte >> 4 } else { byte & 0x0F };
                dot += i32::from(q) * qa(32 * j + i);
            }
            sum_q += i32::from(wb[SC_AT + 16 * j + r]) * dot;
            sum_m += i32::from(wb[M_AT + 16 * j + r]) * (bs(2 * j) + bs(2 * j + 1));
        }
        let (d, dmin) = (f16_at(&wb[2 * r..]), f16_at(&wb[DMIN_AT + 2 * r..]));
        acc += d * da * sum_q as f32 - dmin * da * sum_m as f32;
    }
    acc
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::tile as tile_avx2;
#[cfg(target_arch = "x86_64")]
pub(super) use avx512::tile;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{BLOCK_BYTES, DMIN_AT, M_AT, Q_AT, SC_AT};
    use crate::simd::packed::Q8K_BLOCK_BYTES;

    /// `T` tokens × 16 rows over `nb` super-blocks. Per half of a 64-element pair the 8
    /// unpacked nibble registers serve every token; each sub-block's integer dot is scaled by
    /// its 6-bit scale in i32 (exact, as ggml's), the mins' term comes from the Q8_K sums.
    ///
    /// # Safety
    /// AVX-512 F/BW + VNNI + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
    pub(in super::super) unsafe fn tile<const T: usize>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let m4 = _mm512_set1_epi8(0x0F);
        let mut f = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            // SAFETY: super-block b of the group and of every token row is in bounds (caller).
            unsafe {
                let wb = w.add(b * BLOCK_BYTES);
                if pf != 0 {
                    crate::simd::prefetch(wb.wrapping_add(pf), BLOCK_BYTES);
                }
                let mut sumi = [_mm512_setzero_si512(); T];
                for p in 0..4 {
                    let sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        wb.add(SC_AT + 16 * 2 * p) as *const __m128i
                    ));
                    let sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                        wb.add(SC_AT + 16 * (2 * p + 1)) as *const __m128i,
                    ));
                    for half in 0..2 {
                        let mut lo = [_mm512_setzero_si512(); 4];
                        let mut hi = [_mm512_setzero_si512(); 4];
                        for cc in 0..4 {
                            let c = 4 * half + cc;
                            let q = _mm512_loadu_si512(
                                wb.add(Q_AT + 64 * (8 * p + c)) as *const __m512i
                            );
                            lo[cc] = _mm512_and_si512(q, m4);
                            hi[cc] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                        }
                        for (t, st) in sumi.iter_mut().enumerate() {
                            let xq = x.add(t * x_stride + b * Q8K_BLOCK_BYTES + 4 + 64 * p);
                            let mut al = _mm512_setzero_si512();
                            let mut ah = _mm512_setzero_si512();
                            for cc in 0..4 {
                                let c = 4 * half + cc;
                                let xl = (xq.add(4 * c) as *const i32).read_unaligned();
                                let xh = (xq.add(32 + 4 * c) as *const i32).read_unaligned();
                                al = _mm512_dpbusd_epi32(al, lo[cc], _mm512_set1_epi32(xl));
                                ah = _mm512_dpbusd_epi32(ah, hi[cc], _mm512_set1_epi32(xh));
                            }
                            *st = _mm512_add_epi32(*st, _mm512_mullo_epi32(al, sc_lo));
                            *st = _mm512_add_epi32(*st, _mm512_mullo_epi32(ah, sc_hi));
                        }
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb as *const __m256i));
                let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(DMIN_AT) as *const __m256i));
                for (t, ft) in f.iter_mut().enumerate() {
                    let xb = x.add(t * x_stride + b * Q8K_BLOCK_BYTES);
                    let bs = xb.add(260) as *const i16;
                    let mut summ = _mm512_setzero_si512();
                    for j in 0..8 {
                        let s = i32::from(bs.add(2 * j).read_unaligned())
                            + i32::from(bs.add(2 * j + 1).read_unaligned());
                        let m = _mm512_cvtepu8_epi32(_mm_loadu_si128(
                            wb.add(M_AT + 16 * j) as *const __m128i
                        ));
                        summ = _mm512_add_epi32(summ, _mm512_mullo_epi32(m, _mm512_set1_epi32(s)));
                    }
                    let da = _mm512_set1_ps((xb as *const f32).read_unaligned());
                    let q = _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(sumi[t]));
                    let mn = _mm512_mul_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(summ));
                    *ft = _mm512_add_ps(*ft, _mm512_sub_ps(q, mn));
                }
            }
        }
        // SAFETY: the `valid` columns of the T output rows are this thread's (caller).
        unsafe { super::super::store_summed(&[f], out, out_stride, valid) };
    }
}

/// The AVX2 twin: the 16 rows as two halves of 8, half after half; `vpdpbusd` becomes
/// `vpmaddubsw` + `vpmaddwd` + add (nibble × i8 pairs fit i16), the scales and mins are each
/// half's 8 bytes, and every integer and float step is the AVX-512 tile's, lane for lane: the
/// same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK_BYTES, DMIN_AT, M_AT, Q_AT, SC_AT};
    use crate::simd::packed::Q8K_BLOCK_BYTES;

    /// `T` (at most 4: its sums stay in registers) tokens × 16 rows over `nb` super-blocks.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn tile<const T: usize>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let bytes8 = |p: *const u8| {
            // SAFETY: 8 bytes at p (callers below).
            _mm256_cvtepu8_epi32(unsafe { _mm_loadl_epi64(p as *const __m128i) })
        };
        for h in 0..2 {
            let rows = valid.saturating_sub(8 * h).min(8);
            if rows == 0 {
                break;
            }
            let mut f = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                // SAFETY: super-block b of the group and of every token row is in bounds
                // (caller).
                unsafe {
                    let wb = w.add(b * BLOCK_BYTES);
                    if pf != 0 && h == 0 {
                        crate::simd::prefetch(wb.wrapping_add(pf), BLOCK_BYTES);
                    }
                    let mut sumi = [_mm256_setzero_si256(); T];
                    for p in 0..4 {
                        let sc_lo = bytes8(wb.add(SC_AT + 16 * 2 * p + 8 * h));
                        let sc_hi = bytes8(wb.add(SC_AT + 16 * (2 * p + 1) + 8 * h));
                        for part in 0..2 {
                            let mut lo = [_mm256_setzero_si256(); 4];
                            let mut hi = [_mm256_setzero_si256(); 4];
                            for cc in 0..4 {
                                let c = 4 * part + cc;
                                let q = _mm256_loadu_si256(
                                    wb.add(Q_AT + 64 * (8 * p + c) + 32 * h) as *const __m256i,
                                );
                                lo[cc] = _mm256_and_si256(q, m4);
                                hi[cc] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                            }
                            for (t, st) in sumi.iter_mut().enumerate() {
                                let xq = x.add(t * x_stride + b * Q8K_BLOCK_BYTES + 4 + 64 * p);
                                // Four byte-pair products of 4-bit quants and Q8_K bytes
                                // (each at most 2·15·128 = 3840 in magnitude) add up in 16
                                // bits exactly, then widen once: the same integers as a
                                // widening per product, 2 `vpmaddwd` instead of 8.
                                let mut sl = _mm256_setzero_si256();
                                let mut sh = _mm256_setzero_si256();
                                for cc in 0..4 {
                                    let c = 4 * part + cc;
                                    let xl = (xq.add(4 * c) as *const i32).read_unaligned();
                                    let xh = (xq.add(32 + 4 * c) as *const i32).read_unaligned();
                                    let pl = _mm256_maddubs_epi16(lo[cc], _mm256_set1_epi32(xl));
                                    let ph = _mm256_maddubs_epi16(hi[cc], _mm256_set1_epi32(xh));
                                    sl = _mm256_add_epi16(sl, pl);
                                    sh = _mm256_add_epi16(sh, ph);
                                }
                                let al = _mm256_madd_epi16(sl, ones);
                                let ah = _mm256_madd_epi16(sh, ones);
                                *st = _mm256_add_epi32(*st, _mm256_mullo_epi32(al, sc_lo));
                                *st = _mm256_add_epi32(*st, _mm256_mullo_epi32(ah, sc_hi));
                            }
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h) as *const __m128i));
                    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(
                        wb.add(DMIN_AT + 16 * h) as *const __m128i
                    ));
                    for (t, ft) in f.iter_mut().enumerate() {
                        let xb = x.add(t * x_stride + b * Q8K_BLOCK_BYTES);
                        let bs = xb.add(260) as *const i16;
                        let mut summ = _mm256_setzero_si256();
                        for j in 0..8 {
                            let s = i32::from(bs.add(2 * j).read_unaligned())
                                + i32::from(bs.add(2 * j + 1).read_unaligned());
                            let m = bytes8(wb.add(M_AT + 16 * j + 8 * h));
                            summ =
                                _mm256_add_epi32(summ, _mm256_mullo_epi32(m, _mm256_set1_epi32(s)));
                        }
                        let da = _mm256_set1_ps((xb as *const f32).read_unaligned());
                        let q = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sumi[t]));
                        let mn = _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(summ));
                        *ft = _mm256_add_ps(*ft, _mm256_sub_ps(q, mn));
                    }
                }
            }
            for (t, ft) in f.iter().enumerate() {
                // SAFETY: the `valid` columns of token t's output row are this thread's (caller).
                unsafe {
                    crate::simd::store_first_lanes8(out.add(t * out_stride + 8 * h), rows, *ft)
                };
            }
        }
    }
}
