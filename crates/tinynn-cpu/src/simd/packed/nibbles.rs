//! The layout and SIMD kernel shared by the 4- and 5-bit kinds (Q4_0, Q4_1, Q5_0, Q5_1).
//!
//! Group block: `d[16]` f16; with a min, `m[16]` f16; with a 5th bit, 8 bit-planes of 64 bits
//! (see below); then for j in 0..4 the 16 rows' quant bytes `4j..4j+4` (64 B). A byte's low
//! nibble is element `i`, its high nibble element `i + 16`, as in the file formats.
//!
//! The 5th bits are stored as `vpdpbusd`-lane masks: plane `j` (at `8j`) has bit `4r + i` set
//! when element `4j + i` of row `r` has its 5th bit, plane `4 + j` (at `32 + 8j`) the same for
//! element `16 + 4j + i`. One `kmov` and one masked byte add put the bit in place, and the
//! block keeps the file's size (5.5 bits a weight for Q5_0, 6 for Q5_1): decode is bound by
//! the bytes it reads, so whole 5-bit bytes (8.5 bits a weight) would cost ~55% more there.
//!
//! Weights without a min are stored biased (`q + off`, unsigned); the activation block's exact
//! `Σqa` removes the bias: `Σ (q − off)·qa = Σ q·qa − off·Σqa`.

/// Bytes of a group block.
pub(super) const fn block_bytes(min: bool, high: bool) -> usize {
    quants_at(min, high) + 256
}

/// Offset of `m[16]`.
pub(super) const M_AT: usize = 32;

/// Offset of the 5th-bit planes.
pub(super) const fn planes_at(min: bool) -> usize {
    if min {
        64
    } else {
        32
    }
}

/// Offset of the quant bytes.
pub(super) const fn quants_at(min: bool, high: bool) -> usize {
    planes_at(min) + if high { 64 } else { 0 }
}

/// Writes row `r`'s 16 quant bytes (and, with `qh`, its 5th bits) into a group block.
pub(super) fn pack_quants(qs: &[u8], qh: Option<u32>, min: bool, r: usize, dst: &mut [u8]) {
    let qa = quants_at(min, qh.is_some());
    for j in 0..4 {
        dst[qa + 64 * j + 4 * r..][..4].copy_from_slice(&qs[4 * j..][..4]);
    }
    if let Some(qh) = qh {
        let pa = planes_at(min);
        for e in 0..32 {
            if qh >> e & 1 == 1 {
                // Element e = 16·h + 4j + i lies in plane 4h + j, lane byte 4r + i.
                let (h, j, i) = (e / 16, e % 16 / 4, e % 4);
                let bit = 4 * r + i;
                dst[pa + 8 * (4 * h + j) + bit / 8] |= 1 << (bit % 8);
            }
        }
    }
}

/// The inverse of [`pack_quants`]: row `r`'s 16 quant bytes into `qs`, and its 5th bits (as
/// the file's `qh`) when `high`.
pub(super) fn unpack_quants(wb: &[u8], min: bool, high: bool, r: usize, qs: &mut [u8]) -> u32 {
    let qa = quants_at(min, high);
    for j in 0..4 {
        qs[4 * j..][..4].copy_from_slice(&wb[qa + 64 * j + 4 * r..][..4]);
    }
    let mut qh = 0u32;
    if high {
        let pa = planes_at(min);
        for e in 0..32 {
            let (h, j, i) = (e / 16, e % 16 / 4, e % 4);
            let bit = 4 * r + i;
            qh |= u32::from(wb[pa + 8 * (4 * h + j) + bit / 8] >> (bit % 8) & 1) << e;
        }
    }
    qh
}

/// The 32 quants (5-bit when `high`) of row `r` in a group block, from the packed bytes.
pub(super) fn unpack_ref(wb: &[u8], min: bool, high: bool, r: usize) -> [u8; 32] {
    let (qa, pa) = (quants_at(min, high), planes_at(min));
    let mut q = [0u8; 32];
    for j in 0..4 {
        for i in 0..4 {
            let byte = wb[qa + 64 * j + 4 * r + i];
            q[4 * j + i] = byte & 0x0F;
            q[16 + 4 * j + i] = byte >> 4;
            if high {
                let bit = 4 * r + i;
                for h in 0..2 {
                    let plane = &wb[pa + 8 * (4 * h + j)..][..8];
                    q[16 * h + 4 * j + i] |= (plane[bit / 8] >> (bit % 8) & 1) << 4;
                }
            }
        }
    }
    q
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::tile as tile_avx2;
#[cfg(target_arch = "x86_64")]
pub(super) use avx512::tile;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{block_bytes, planes_at, quants_at, M_AT};

    /// `T` tokens × 16 rows over `nb` blocks; `MIN`: a min per row (activation slot `s`),
    /// `HIGH`: 5th-bit planes, `OFF`: the bias of min-less weights (activation slot `Σqa`).
    ///
    /// # Safety
    /// AVX-512 F/BW + VNNI + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c,fma")]
    pub(in super::super) unsafe fn tile<
        const T: usize,
        const MIN: bool,
        const HIGH: bool,
        const OFF: i32,
    >(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let (bb, pa, qa) = (block_bytes(MIN, HIGH), planes_at(MIN), quants_at(MIN, HIGH));
        let m4 = _mm512_set1_epi8(0x0F);
        let b4 = _mm512_set1_epi8(0x10);
        let mut f = [_mm512_setzero_ps(); T];
        for b in 0..nb {
            // SAFETY: block b of the group and of every token row is in bounds (caller).
            unsafe {
                let wb = w.add(b * bb);
                if pf != 0 {
                    // Streaming the group from memory: ask for the block `pf` bytes ahead.
                    crate::simd::prefetch(wb.wrapping_add(pf), bb);
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(wb as *const __m256i));
                let mn = if MIN {
                    _mm512_cvtph_ps(_mm256_loadu_si256(wb.add(M_AT) as *const __m256i))
                } else {
                    _mm512_setzero_ps()
                };
                let mut lo = [_mm512_setzero_si512(); 4];
                let mut hi = [_mm512_setzero_si512(); 4];
                for j in 0..4 {
                    let q = _mm512_loadu_si512(wb.add(qa + 64 * j) as *const __m512i);
                    lo[j] = _mm512_and_si512(q, m4);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                    if HIGH {
                        let kl = (wb.add(pa + 8 * j) as *const u64).read_unaligned();
                        let kh = (wb.add(pa + 32 + 8 * j) as *const u64).read_unaligned();
                        lo[j] = _mm512_mask_add_epi8(lo[j], kl, lo[j], b4);
                        hi[j] = _mm512_mask_add_epi8(hi[j], kh, hi[j], b4);
                    }
                }
                for (t, ft) in f.iter_mut().enumerate() {
                    let xb = x.add(t * x_stride + b * 36);
                    let head = (xb as *const i32).read_unaligned();
                    let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(head));
                    let mut acc = if MIN {
                        _mm512_setzero_si512()
                    } else {
                        _mm512_set1_epi32(-OFF * i32::from((head >> 16) as i16))
                    };
                    for j in 0..4 {
                        let xl = (xb.add(4 + 4 * j) as *const i32).read_unaligned();
                        let xh = (xb.add(20 + 4 * j) as *const i32).read_unaligned();
                        acc = _mm512_dpbusd_epi32(acc, lo[j], _mm512_set1_epi32(xl));
                        acc = _mm512_dpbusd_epi32(acc, hi[j], _mm512_set1_epi32(xh));
                    }
                    let da = _mm512_broadcastss_ps(ds);
                    *ft = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), _mm512_mul_ps(d, da), *ft);
                    if MIN {
                        let sa = _mm512_broadcastss_ps(_mm_movehdup_ps(ds));
                        *ft = _mm512_fmadd_ps(mn, sa, *ft);
                    }
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

/// The AVX2 twin of the AVX-512 tile (Q4_0, Q4_1, Q5_0, Q5_1): the group's 16 rows as two
/// halves of 8 (one ymm lane a row), half after half. `vpdpbusd` becomes `vpmaddubsw` +
/// `vpmaddwd` (5-bit × i8 pairs stay far inside i16) and an add, giving the same i32 sums; the
/// 5th bits' 32-bit half-plane is spread to a byte mask (`vpshufb` + compare) where AVX-512
/// uses a `kmov`; the float steps are the AVX-512 tile's, lane for lane, so the two give the
/// same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{block_bytes, planes_at, quants_at, M_AT};

    /// Byte-pair products (`vpmaddubsw` lanes) a 16-bit sum takes before it is widened:
    /// a lane is `w₀x₀ + w₁x₁` with weights below 16 (4 bits) or 32 (5) and activations in
    /// −128..=127, so at most 2·15·128 = 3840 or 2·31·128 = 7936 in magnitude; 8 of the first
    /// (30720) or 4 of the second (31744) stay inside an i16, so the sums are exact and the
    /// result is the one a widening per product gives, with 1 or 2 `vpmaddwd` a block
    /// instead of 8.
    const fn i16_terms<const HIGH: bool>() -> usize {
        if HIGH {
            4
        } else {
            8
        }
    }

    /// 0x10 in the bytes of `bits` (byte i: bit i) that are set.
    ///
    /// # Safety
    /// AVX2.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn fifth_bits(bits: u32) -> __m256i {
        // Byte i takes mask byte i / 8 (vpshufb works per 128-bit lane: the low lane holds
        // bytes 0..16, mask bytes 0 and 1; the high lane mask bytes 2 and 3).
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(bits as i32),
            _mm256_setr_epi8(
                0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3,
                3, 3, 3, 3,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
    }

    /// `T` tokens × 16 rows over `nb` blocks; `MIN`, `HIGH` and `OFF` as the AVX-512 tile's.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(in super::super) unsafe fn tile<
        const T: usize,
        const MIN: bool,
        const HIGH: bool,
        const OFF: i32,
    >(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let (bb, pa, qa) = (block_bytes(MIN, HIGH), planes_at(MIN), quants_at(MIN, HIGH));
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        if T == 1 {
            // SAFETY: the caller's contract.
            return unsafe { tile1::<MIN, HIGH, OFF>(group, x, out, valid) };
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
                    let wb = w.add(b * bb);
                    if pf != 0 && h == 0 {
                        crate::simd::prefetch(wb.wrapping_add(pf), bb);
                    }
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h) as *const __m128i));
                    let mn = if MIN {
                        _mm256_cvtph_ps(_mm_loadu_si128(wb.add(M_AT + 16 * h) as *const __m128i))
                    } else {
                        _mm256_setzero_ps()
                    };
                    let mut lo = [_mm256_setzero_si256(); 4];
                    let mut hi = [_mm256_setzero_si256(); 4];
                    for j in 0..4 {
                        let q = _mm256_loadu_si256(wb.add(qa + 64 * j + 32 * h) as *const __m256i);
                        lo[j] = _mm256_and_si256(q, m4);
                        hi[j] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                        if HIGH {
                            // This half's 32 bits of the planes of elements 4j.. and 16 + 4j..
                            let kl = (wb.add(pa + 8 * j + 4 * h) as *const u32).read_unaligned();
                            let kh =
                                (wb.add(pa + 32 + 8 * j + 4 * h) as *const u32).read_unaligned();
                            lo[j] = _mm256_add_epi8(lo[j], fifth_bits(kl));
                            hi[j] = _mm256_add_epi8(hi[j], fifth_bits(kh));
                        }
                    }
                    for (t, ft) in f.iter_mut().enumerate() {
                        let xb = x.add(t * x_stride + b * 36);
                        let head = (xb as *const i32).read_unaligned();
                        let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(head));
                        let mut acc = if MIN {
                            _mm256_setzero_si256()
                        } else {
                            _mm256_set1_epi32(-OFF * i32::from((head >> 16) as i16))
                        };
                        // The byte products summed in 16 bits first (see `I16_TERMS`), then
                        // widened: the same integers, fewer multiplies.
                        let mut s16 = [_mm256_setzero_si256(); 2];
                        for j in 0..4 {
                            let xl = (xb.add(4 + 4 * j) as *const i32).read_unaligned();
                            let xh = (xb.add(20 + 4 * j) as *const i32).read_unaligned();
                            let pl = _mm256_maddubs_epi16(lo[j], _mm256_set1_epi32(xl));
                            let ph = _mm256_maddubs_epi16(hi[j], _mm256_set1_epi32(xh));
                            let k = 2 * j / i16_terms::<HIGH>();
                            s16[k] = _mm256_add_epi16(s16[k], _mm256_add_epi16(pl, ph));
                        }
                        for s in &s16[..8 / i16_terms::<HIGH>()] {
                            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(*s, ones));
                        }
                        let da = _mm256_broadcastss_ps(ds);
                        *ft = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), _mm256_mul_ps(d, da), *ft);
                        if MIN {
                            let sa = _mm256_broadcastss_ps(_mm_movehdup_ps(ds));
                            *ft = _mm256_fmadd_ps(mn, sa, *ft);
                        }
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

    /// [`tile`] for one token (decode): both halves per block, so each weight line is read
    /// once; the same operations per lane.
    ///
    /// # Safety
    /// As [`tile`].
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile1<const MIN: bool, const HIGH: bool, const OFF: i32>(
        group: super::super::GroupIn,
        x: *const u8,
        out: *mut f32,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let (bb, pa, qa) = (block_bytes(MIN, HIGH), planes_at(MIN), quants_at(MIN, HIGH));
        let m4 = _mm256_set1_epi8(0x0F);
        let ones = _mm256_set1_epi16(1);
        let mut f = [_mm256_setzero_ps(); 2];
        for b in 0..nb {
            // SAFETY: block b of the group and of the token's row is in bounds (caller).
            unsafe {
                let wb = w.add(b * bb);
                if pf != 0 {
                    crate::simd::prefetch(wb.wrapping_add(pf), bb);
                }
                let xb = x.add(b * 36);
                let head = (xb as *const i32).read_unaligned();
                let ds = _mm_cvtph_ps(_mm_cvtsi32_si128(head));
                let init = if MIN {
                    _mm256_setzero_si256()
                } else {
                    _mm256_set1_epi32(-OFF * i32::from((head >> 16) as i16))
                };
                let mut acc = [init; 2];
                // Per half, the byte products summed in 16 bits first (see `I16_TERMS`).
                let mut s16 = [[_mm256_setzero_si256(); 2]; 2];
                for j in 0..4 {
                    let xl = _mm256_set1_epi32((xb.add(4 + 4 * j) as *const i32).read_unaligned());
                    let xh = _mm256_set1_epi32((xb.add(20 + 4 * j) as *const i32).read_unaligned());
                    let k = 2 * j / i16_terms::<HIGH>();
                    for (h, sh) in s16.iter_mut().enumerate() {
                        let q = _mm256_loadu_si256(wb.add(qa + 64 * j + 32 * h) as *const __m256i);
                        let mut lo = _mm256_and_si256(q, m4);
                        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                        if HIGH {
                            let kl = (wb.add(pa + 8 * j + 4 * h) as *const u32).read_unaligned();
                            let kh =
                                (wb.add(pa + 32 + 8 * j + 4 * h) as *const u32).read_unaligned();
                            lo = _mm256_add_epi8(lo, fifth_bits(kl));
                            hi = _mm256_add_epi8(hi, fifth_bits(kh));
                        }
                        let pl = _mm256_maddubs_epi16(lo, xl);
                        let ph = _mm256_maddubs_epi16(hi, xh);
                        sh[k] = _mm256_add_epi16(sh[k], _mm256_add_epi16(pl, ph));
                    }
                }
                for (a, sh) in acc.iter_mut().zip(&s16) {
                    for s in &sh[..8 / i16_terms::<HIGH>()] {
                        *a = _mm256_add_epi32(*a, _mm256_madd_epi16(*s, ones));
                    }
                }
                let da = _mm256_broadcastss_ps(ds);
                for (h, fh) in f.iter_mut().enumerate() {
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(wb.add(16 * h) as *const __m128i));
                    *fh = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[h]), _mm256_mul_ps(d, da), *fh);
                    if MIN {
                        let mn = _mm256_cvtph_ps(_mm_loadu_si128(
                            wb.add(M_AT + 16 * h) as *const __m128i
                        ));
                        let sa = _mm256_broadcastss_ps(_mm_movehdup_ps(ds));
                        *fh = _mm256_fmadd_ps(mn, sa, *fh);
                    }
                }
            }
        }
        for (h, fh) in f.iter().enumerate() {
            let rows = valid.saturating_sub(8 * h).min(8);
            if rows == 0 {
                break;
            }
            // SAFETY: the `valid` columns of the token's output row are this thread's (caller).
            unsafe { crate::simd::store_first_lanes8(out.add(8 * h), rows, *fh) };
        }
    }
}
