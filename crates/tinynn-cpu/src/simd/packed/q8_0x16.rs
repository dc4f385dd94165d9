//! Q8_0 × 16 rows. Group block (544 B): `d[16]` f16, then for j in 0..8 the 16 rows' quants
//! `4j..4j+4` stored as u8 `q + 128` (64 B), which `vpdpbusd` takes as its unsigned operand.
//! The activation block's 16-bit slot holds the exact `Σqa`, so
//! `Σ q·qa = Σ (q + 128)·qa − 128·Σqa`; dot = Σ_blocks d·da·Σ q·qa.

use super::{f16_at, ACT_BLOCK_BYTES};

/// Writes row `r`'s Q8_0 block (34 B: d, 32 × i8) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    for j in 0..8 {
        for i in 0..4 {
            dst[32 + 64 * j + 4 * r + i] = src[2 + 4 * j + i] ^ 0x80;
        }
    }
}

/// Row `r` of a group (`w`: its whole blocks) as f32, `q · d` as the Q8_0 dequantizer gives
/// it, straight from the packed bytes (the head's f32 gradient product dequantizes 4096-row
/// panels of it every training step).
pub(super) fn dequantize_row(w: &[u8], r: usize, out: &mut [f32]) {
    for (wb, ob) in w.chunks_exact(544).zip(out.chunks_exact_mut(32)) {
        let d = f16_at(&wb[2 * r..]);
        // The row's 4 quants of each 64-byte step, taken as one array so the four
        // conversions compile to one vector step (a byte at a time ran ~4 cycles each).
        for (qj, oj) in wb[32..].chunks_exact(64).zip(ob.chunks_exact_mut(4)) {
            let q: [u8; 4] = [qj[4 * r], qj[4 * r + 1], qj[4 * r + 2], qj[4 * r + 3]];
            let v = q.map(|b| f32::from((b ^ 0x80) as i8) * d);
            oj.copy_from_slice(&v);
        }
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for b in 0..nb {
        let wb = &w[b * 544..][..544];
        let xb = &x[b * ACT_BLOCK_BYTES..][..ACT_BLOCK_BYTES];
        let mut isum = 0i32;
        for j in 0..8 {
            for i in 0..4 {
                let q = i32::from(wb[32 + 64 * j + 4 * r + i]) - 128;
                isum += q * i32::from(xb[4 + 4 * j + i] as i8);
            }
        }
        acc += isum as f32 * f16_at(&wb[2 * r..]) * f16_at(xb);
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

    /// `T` tokens × 16 rows over `nb` blocks.
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
            // SAFETY: block b of the group and of every token row is in bounds (caller).
            unsafe {
                let wb = w.add(b * 544);
                if pf != 0 {
                    // Streaming the group from memory: ask for the block `pf` bytes ahead.
                    crate::simd::prefetch(wb.wrapping_add(pf), 544);
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb as *const __m256i));
                let mut q = [_mm512_setzero_si512(); 8];
                for (j, qj) in q.iter_mut().enumerate() {
                    *qj = _mm512_loadu_si512(wb.add(32 + 64 * j) as *const __m512i);
                }
                for (t, ft) in f.iter_mut().enumerate() {
                    let xb = x.add(t * x_stride + b * 36);
                    let head = (xb as *const i32).read_unaligned();
                    let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(head));
                    let sum = i32::from((head >> 16) as i16);
                    let mut acc = _mm512_set1_epi32(-128 * sum);
                    for (j, qj) in q.iter().enumerate() {
                        let xj = (xb.add(4 + 4 * j) as *const i32).read_unaligned();
                        acc = _mm512_dpbusd_epi32(acc, *qj, _mm512_set1_epi32(xj));
                    }
                    let dd = _mm512_mul_ps(d, _mm512_broadcastss_ps(ds));
                    *ft = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), dd, *ft);
                }
            }
        }
        let mask = super::super::lanes(valid);
        for (t, ft) in f.iter().enumerate() {
            // SAFETY: the `valid` columns of token t's output row are this thread's (caller).
            unsafe { _mm512_mask_storeu_ps(out.add(t * out_stride), mask, *ft) };
        }
    }
}

/// The AVX2 twin: 8 rows a ymm, half after half. `vpmaddubsw` cannot take the biased bytes
/// (255 · 127 · 2 overflows i16), so the quants are unbiased (`q = byte ^ 0x80`) and multiplied
/// as `|q| · (qa with q's sign)` (|products| ≤ 128 · 127 · 2 fit; the activation quantizer
/// never emits −128): the exact `Σ q·qa` the AVX-512 tile reaches through the bias, then the
/// same float steps, so both give the same bits.
///
/// `SEVEN` (Q7_0x16, |q| ≤ 63): the quants are biased by 64 instead (`q + 64 = byte − 64`,
/// 1..=127) and taken as the unsigned operand as they are, with `−64·Σqa` as the sum's start
/// (as the AVX-512 tile does with 128): no sign step, 2 · 127 · 127 fits i16. The same exact
/// integer sum, so the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// The unsigned operand and its sign source from 32 packed bytes (`q + 128`).
    ///
    /// # Safety
    /// AVX2 present.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn operands<const SEVEN: bool>(raw: __m256i) -> (__m256i, __m256i) {
        if SEVEN {
            (_mm256_sub_epi8(raw, _mm256_set1_epi8(64)), raw)
        } else {
            let q = _mm256_xor_si256(raw, _mm256_set1_epi8(-128));
            (_mm256_abs_epi8(q), q)
        }
    }

    /// `Σ_4 u·x` per 32-bit lane for the operands of [`operands`] and 4 activation bytes `xj`.
    ///
    /// # Safety
    /// AVX2 present.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn dot4<const SEVEN: bool>(u: __m256i, q: __m256i, xj: i32) -> __m256i {
        let x = _mm256_set1_epi32(xj);
        let x = if SEVEN { x } else { _mm256_sign_epi8(x, q) };
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1))
    }

    /// The start of a block's integer sum: `−64·Σqa` for `SEVEN`, else 0.
    ///
    /// # Safety
    /// AVX2 present.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn start<const SEVEN: bool>(head: i32) -> __m256i {
        let sum = i32::from((head >> 16) as i16);
        _mm256_set1_epi32(if SEVEN { -64 * sum } else { 0 })
    }

    /// `T` tokens × 16 rows over `nb` blocks.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn tile<const T: usize, const SEVEN: bool>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let store = |h: usize, t: usize, v: __m256| {
            let rows = valid.saturating_sub(8 * h).min(8);
            // SAFETY: the `valid` columns of token t's output row are this thread's (caller).
            unsafe { crate::simd::store_first_lanes8(out.add(t * out_stride + 8 * h), rows, v) };
        };
        if T == 1 {
            // Decode: both halves per block, so each weight line is read once.
            let mut f = [_mm256_setzero_ps(); 2];
            for b in 0..nb {
                // SAFETY: block b of the group and of the token's row is in bounds (caller).
                unsafe {
                    let wb = w.add(b * 544);
                    if pf != 0 {
                        crate::simd::prefetch(wb.wrapping_add(pf), 544);
                    }
                    let xb = x.add(b * 36);
                    let head = (xb as *const i32).read_unaligned();
                    let da = _mm256_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(head)));
                    let mut acc = [start::<SEVEN>(head); 2];
                    for j in 0..8 {
                        let xj = (xb.add(4 + 4 * j) as *const i32).read_unaligned();
                        for (h, a) in acc.iter_mut().enumerate() {
                            let raw =
                                _mm256_loadu_si256(wb.add(32 + 64 * j + 32 * h) as *const __m256i);
                            let (u, q) = operands::<SEVEN>(raw);
                            *a = _mm256_add_epi32(*a, dot4::<SEVEN>(u, q, xj));
                        }
                    }
                    for (h, fh) in f.iter_mut().enumerate() {
                        let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h) as *const __m128i));
                        *fh =
                            _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_mul_ps(d, da), *fh);
                    }
                }
            }
            store(0, 0, f[0]);
            if valid > 8 {
                store(1, 0, f[1]);
            }
            return;
        }
        for h in 0..2 {
            let rows = valid.saturating_sub(8 * h).min(8);
            if rows == 0 {
                break;
            }
            let mut f = [_mm256_setzero_ps(); T];
            for b in 0..nb {
                // SAFETY: block b of the group and of every token row is in bounds (caller).
                unsafe {
                    let wb = w.add(b * 544);
                    if pf != 0 && h == 0 {
                        crate::simd::prefetch(wb.wrapping_add(pf), 544);
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h) as *const __m128i));
                    let mut u = [_mm256_setzero_si256(); 8];
                    let mut q = [_mm256_setzero_si256(); 8];
                    for j in 0..8 {
                        let raw =
                            _mm256_loadu_si256(wb.add(32 + 64 * j + 32 * h) as *const __m256i);
                        (u[j], q[j]) = operands::<SEVEN>(raw);
                    }
                    for (t, ft) in f.iter_mut().enumerate() {
                        let xb = x.add(t * x_stride + b * 36);
                        let head = (xb as *const i32).read_unaligned();
                        let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(head));
                        let mut acc = start::<SEVEN>(head);
                        for j in 0..8 {
                            let xj = (xb.add(4 + 4 * j) as *const i32).read_unaligned();
                            acc = _mm256_add_epi32(acc, dot4::<SEVEN>(u[j], q[j], xj));
                        }
                        let dd = _mm256_mul_ps(d, _mm256_broadcastss_ps(ds));
                        *ft = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), dd, *ft);
                    }
                }
            }
            for (t, ft) in f.iter().enumerate() {
                store(h, t, *ft);
            }
        }
    }
}
