//! Q6_K × 16 rows, one 256-element super-block at a time (4384 B a group block):
//!
//! ```text
//! 0     d[16]      f16     the rows' super-block scales
//! 32    sc[16][16] i8      16-element sub-block j's scale of row r at 32 + 16j + r
//! 288   q[64]      64 B    chunk c: elements 4c..4c+4 of each of the 16 rows as `q + 32`
//!                          (0..63, the unsigned operand of `vpdpbusd`)
//! ```
//!
//! Whole bytes instead of the file's 4 + 2 bits (30% more bytes than the file's 210 a row):
//! the kernel then needs no bit shuffling. Row value = `d·sc_j·q`, `q ∈ −32..31`. With Q8_K
//! activations (`x = da·qa`, 16-value sums `bs`), as ggml's `vec_dot_q6_K_q8_K`:
//! dot = Σ_superblocks `da·d·Σ_j sc_j·(Σ (q + 32)·qa − 32·bs_j)`.

use super::{f16_at, Q8K_BLOCK_BYTES};

/// Bytes of a group block.
pub(super) const BLOCK_BYTES: usize = Q_AT + 4096;
const SC_AT: usize = 32;
const Q_AT: usize = 288;

/// Where element `i`'s low 4 bits (byte index in `ql`, shift) and high 2 bits (byte index in
/// `qh`, shift) live in the file's block.
fn bits_of(i: usize) -> ((usize, u32), (usize, u32)) {
    let (half, within) = (i / 128, i % 128);
    let (k, l) = (within / 32, within % 32);
    let low = (half * 64 + l + 32 * (k % 2), if k < 2 { 0 } else { 4 });
    let high = (half * 32 + l, 2 * k as u32);
    (low, high)
}

/// Writes row `r`'s Q6_K super-block (210 B: ql, qh, 16 scales, d).
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..][..2].copy_from_slice(&src[208..210]);
    for j in 0..16 {
        dst[SC_AT + 16 * j + r] = src[192 + j];
    }
    for i in 0..256 {
        let ((lb, ls), (hb, hs)) = bits_of(i);
        let v = ((src[lb] >> ls) & 0x0F) | (((src[128 + hb] >> hs) & 3) << 4);
        dst[Q_AT + 64 * (i / 4) + 4 * r + i % 4] = v;
    }
}

/// The inverse of [`pack_block`]: row `r`'s file super-block.
pub(super) fn unpack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[..192].fill(0);
    for i in 0..256 {
        let v = src[Q_AT + 64 * (i / 4) + 4 * r + i % 4];
        let ((lb, ls), (hb, hs)) = bits_of(i);
        dst[lb] |= (v & 0x0F) << ls;
        dst[128 + hb] |= (v >> 4) << hs;
    }
    for j in 0..16 {
        dst[192 + j] = src[SC_AT + 16 * j + r];
    }
    dst[208..210].copy_from_slice(&src[2 * r..][..2]);
}

/// Row `r` of a group (`nb` super-blocks at `w`) · Q8_K activation row `x`.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * BLOCK_BYTES..][..BLOCK_BYTES];
        let xb = &x[b * Q8K_BLOCK_BYTES..][..Q8K_BLOCK_BYTES];
        let da = f32::from_le_bytes([xb[0], xb[1], xb[2], xb[3]]);
        let mut sum_q = 0i32;
        for j in 0..16 {
            let bs = i32::from(i16::from_le_bytes([xb[260 + 2 * j], xb[261 + 2 * j]]));
            let mut dot = -32 * bs;
            for i in 16 * j..16 * j + 16 {
                let u = wb[Q_AT + 64 * (i / 4) + 4 * r + i % 4];
                dot += i32::from(u) * i32::from(xb[4 + i] as i8);
            }
            sum_q += i32::from(wb[SC_AT + 16 * j + r] as i8) * dot;
        }
        // ggml's K dot subtracts `dmin·da·Σm` with dmin = 0 for Q6_K: exactly `+ 0`.
        acc += f16_at(&wb[2 * r..]) * da * sum_q as f32;
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

    use super::{BLOCK_BYTES, Q_AT, SC_AT};
    use crate::simd::packed::Q8K_BLOCK_BYTES;

    /// `T` tokens × 16 rows over `nb` super-blocks: per 16-element sub-block the 4 weight
    /// registers serve every token; each sub-block's dot (its bias removed with the Q8_K sum)
    /// is scaled by its i8 scale in i32, as ggml's.
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
        let mut f = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            // SAFETY: super-block b of the group and of every token row is in bounds (caller).
            unsafe {
                let wb = w.add(b * BLOCK_BYTES);
                if pf != 0 {
                    crate::simd::prefetch(wb.wrapping_add(pf), BLOCK_BYTES);
                }
                let mut sumi = [_mm512_setzero_si512(); T];
                for j in 0..16 {
                    let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(
                        wb.add(SC_AT + 16 * j) as *const __m128i
                    ));
                    let mut q = [_mm512_setzero_si512(); 4];
                    for (c, qc) in q.iter_mut().enumerate() {
                        *qc = _mm512_loadu_si512(wb.add(Q_AT + 64 * (4 * j + c)) as *const __m512i);
                    }
                    for (t, st) in sumi.iter_mut().enumerate() {
                        let xb = x.add(t * x_stride + b * Q8K_BLOCK_BYTES);
                        let bs = (xb.add(260 + 2 * j) as *const i16).read_unaligned();
                        let mut acc = _mm512_set1_epi32(-32 * i32::from(bs));
                        for (c, qc) in q.iter().enumerate() {
                            let xa = (xb.add(4 + 16 * j + 4 * c) as *const i32).read_unaligned();
                            acc = _mm512_dpbusd_epi32(acc, *qc, _mm512_set1_epi32(xa));
                        }
                        *st = _mm512_add_epi32(*st, _mm512_mullo_epi32(acc, sc));
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb as *const __m256i));
                for (t, ft) in f.iter_mut().enumerate() {
                    let xb = x.add(t * x_stride + b * Q8K_BLOCK_BYTES);
                    let da = _mm512_set1_ps((xb as *const f32).read_unaligned());
                    let q = _mm512_mul_ps(_mm512_mul_ps(d, da), _mm512_cvtepi32_ps(sumi[t]));
                    *ft = _mm512_add_ps(*ft, q);
                }
            }
        }
        // SAFETY: the `valid` columns of the T output rows are this thread's (caller).
        unsafe { super::super::store_summed(&[f], out, out_stride, valid) };
    }
}

/// The AVX2 twin: two halves of 8 rows, half after half; `vpdpbusd` becomes `vpmaddubsw` +
/// `vpmaddwd` + add (`q + 32` ≤ 63 times i8 pairs fit i16); every integer and float step is
/// the AVX-512 tile's, lane for lane: the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{BLOCK_BYTES, Q_AT, SC_AT};
    use crate::simd::packed::Q8K_BLOCK_BYTES;

    /// `T` (at most 4) tokens × 16 rows over `nb` super-blocks.
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
        let ones = _mm256_set1_epi16(1);
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
                    for j in 0..16 {
                        let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            wb.add(SC_AT + 16 * j + 8 * h) as *const __m128i,
                        ));
                        let mut q = [_mm256_setzero_si256(); 4];
                        for (c, qc) in q.iter_mut().enumerate() {
                            *qc = _mm256_loadu_si256(
                                wb.add(Q_AT + 64 * (4 * j + c) + 32 * h) as *const __m256i
                            );
                        }
                        for (t, st) in sumi.iter_mut().enumerate() {
                            let xb = x.add(t * x_stride + b * Q8K_BLOCK_BYTES);
                            let bs = (xb.add(260 + 2 * j) as *const i16).read_unaligned();
                            let mut acc = _mm256_set1_epi32(-32 * i32::from(bs));
                            // Two byte-pair products of 6-bit quants (stored + 32, below 64)
                            // and Q8_K bytes, each at most 2·63·128 = 16128 in magnitude, add
                            // up in 16 bits exactly before one widening.
                            for (c, qp) in q.chunks_exact(2).enumerate() {
                                let at = xb.add(4 + 16 * j + 8 * c);
                                let x0 = (at as *const i32).read_unaligned();
                                let x1 = (at.add(4) as *const i32).read_unaligned();
                                let p0 = _mm256_maddubs_epi16(qp[0], _mm256_set1_epi32(x0));
                                let p1 = _mm256_maddubs_epi16(qp[1], _mm256_set1_epi32(x1));
                                let pr = _mm256_add_epi16(p0, p1);
                                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pr, ones));
                            }
                            *st = _mm256_add_epi32(*st, _mm256_mullo_epi32(acc, sc));
                        }
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h) as *const __m128i));
                    for (t, ft) in f.iter_mut().enumerate() {
                        let xb = x.add(t * x_stride + b * Q8K_BLOCK_BYTES);
                        let da = _mm256_set1_ps((xb as *const f32).read_unaligned());
                        let q = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(sumi[t]));
                        *ft = _mm256_add_ps(*ft, q);
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
