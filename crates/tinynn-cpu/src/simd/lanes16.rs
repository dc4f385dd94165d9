//! Sixteen f32 lanes as one instruction-set-neutral vocabulary, so a kernel written once runs
//! as AVX-512 (one `__m512`, [`Wide`]) and as AVX2 + FMA (two `__m256`, [`Pair`]).
//!
//! Masks are `u16` bit sets (bit `l` for lane `l`) on both. Every operation is the same IEEE
//! operation lane by lane on both sides (the `exp` of `vexp` included), so a kernel gives the
//! same bits on both.
//!
//! How a kernel uses it: its body is a generic `#[inline(always)]` function over `S: Lanes16`,
//! called from two thin entry points, one per instruction set, each with its
//! `#[target_feature]` set; the body, and these operations (`#[inline(always)]`), are inlined
//! into the entry point and compiled with its features.

use std::arch::x86_64::*;

use super::vexp;

/// Sixteen f32 lanes (`V`), sixteen i32 lanes (`Vi`) and the operations the attention tiles
/// and AdamW use.
///
/// # Safety
/// Every function needs its instruction set ([`Wide`]: AVX-512F/BW/VL/DQ + FMA + F16C;
/// [`Pair`]: AVX2 + FMA + F16C) in the calling entry point; pointer arguments name readable
/// (or, for stores, writable) lanes.
pub(crate) trait Lanes16 {
    type V: Copy;
    type Vi: Copy;
    /// One register per value (32 of them: AVX-512); else two of 16 (AVX2), so a kernel
    /// keeping 8 values live spills, and keeps 4.
    const WIDE: bool;
    unsafe fn zero() -> Self::V;
    unsafe fn splat(x: f32) -> Self::V;
    unsafe fn load(p: *const f32) -> Self::V;
    unsafe fn store(p: *mut f32, x: Self::V);
    /// Lanes in `m` from `p`, the others `src`'s (nothing read outside `m`).
    unsafe fn load_masked(src: Self::V, m: u16, p: *const f32) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn div(a: Self::V, b: Self::V) -> Self::V;
    unsafe fn sqrt(x: Self::V) -> Self::V;
    /// `a · b + c`, rounded once.
    unsafe fn fmadd(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn max(a: Self::V, b: Self::V) -> Self::V;
    /// `b` in the lanes of `m`, `a` elsewhere.
    unsafe fn blend(m: u16, a: Self::V, b: Self::V) -> Self::V;
    /// Lanes where `a != b` (unordered: NaN counts as different).
    unsafe fn ne(a: Self::V, b: Self::V) -> u16;
    /// Lanes where `a > b` (ordered).
    unsafe fn gt(a: Self::V, b: Self::V) -> u16;
    unsafe fn exp(x: Self::V) -> Self::V;
    unsafe fn load_i(p: *const i32) -> Self::Vi;
    unsafe fn splat_i(x: i32) -> Self::Vi;
    unsafe fn add_i(a: Self::Vi, b: Self::Vi) -> Self::Vi;
    /// Lanes where `a >= b`.
    unsafe fn ge_i(a: Self::Vi, b: Self::Vi) -> u16;
    /// Lanes where `a < b`.
    unsafe fn lt_i(a: Self::Vi, b: Self::Vi) -> u16;
    /// `base[idx[l]]` in the lanes of `m`, `src`'s elsewhere.
    unsafe fn gather(src: Self::V, m: u16, idx: Self::Vi, base: *const f32) -> Self::V;
    /// 16 f16 values at `p` as f32.
    unsafe fn load_f16(p: *const u8) -> Self::V;
}

/// AVX-512: one register.
pub(crate) struct Wide;

impl Lanes16 for Wide {
    type V = __m512;
    type Vi = __m512i;
    const WIDE: bool = true;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: __m512) {
        // SAFETY: the trait's contract.
        unsafe { _mm512_storeu_ps(p, x) }
    }
    #[inline(always)]
    unsafe fn load_masked(src: __m512, m: u16, p: *const f32) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe { _mm512_mask_loadu_ps(src, m, p) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        _mm512_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        _mm512_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        _mm512_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn div(a: __m512, b: __m512) -> __m512 {
        _mm512_div_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sqrt(x: __m512) -> __m512 {
        _mm512_sqrt_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn max(a: __m512, b: __m512) -> __m512 {
        _mm512_max_ps(a, b)
    }
    #[inline(always)]
    unsafe fn blend(m: u16, a: __m512, b: __m512) -> __m512 {
        _mm512_mask_blend_ps(m, a, b)
    }
    #[inline(always)]
    unsafe fn ne(a: __m512, b: __m512) -> u16 {
        _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(a, b)
    }
    #[inline(always)]
    unsafe fn gt(a: __m512, b: __m512) -> u16 {
        _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, b)
    }
    #[inline(always)]
    unsafe fn exp(x: __m512) -> __m512 {
        // SAFETY: AVX-512F (the trait's contract).
        unsafe { vexp::exp16(x) }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i32) -> __m512i {
        // SAFETY: the trait's contract.
        unsafe { _mm512_loadu_si512(p as *const __m512i) }
    }
    #[inline(always)]
    unsafe fn splat_i(x: i32) -> __m512i {
        _mm512_set1_epi32(x)
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn ge_i(a: __m512i, b: __m512i) -> u16 {
        _mm512_cmpge_epi32_mask(a, b)
    }
    #[inline(always)]
    unsafe fn lt_i(a: __m512i, b: __m512i) -> u16 {
        _mm512_cmplt_epi32_mask(a, b)
    }
    #[inline(always)]
    unsafe fn gather(src: __m512, m: u16, idx: __m512i, base: *const f32) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe { _mm512_mask_i32gather_ps::<4>(src, m, idx, base) }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> __m512 {
        // SAFETY: the trait's contract.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i)) }
    }
}

/// AVX2: two registers, lanes 0–7 in the first.
pub(crate) struct Pair;

/// The all-ones/all-zeros lane masks of the 8 bits of `m` from bit `shift`.
///
/// # Safety
/// AVX2.
#[inline(always)]
unsafe fn lanes_of(m: u16, shift: u32) -> __m256i {
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let v = _mm256_set1_epi32(i32::from((m >> shift) as u8));
    _mm256_cmpeq_epi32(_mm256_and_si256(v, bits), bits)
}

/// The bit set of two 8-lane compare results.
///
/// # Safety
/// AVX.
#[inline(always)]
unsafe fn bits_of(lo: __m256, hi: __m256) -> u16 {
    (_mm256_movemask_ps(lo) as u16) | (_mm256_movemask_ps(hi) as u16) << 8
}

impl Lanes16 for Pair {
    type V = [__m256; 2];
    type Vi = [__m256i; 2];
    const WIDE: bool = false;
    #[inline(always)]
    unsafe fn zero() -> [__m256; 2] {
        [_mm256_setzero_ps(); 2]
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> [__m256; 2] {
        [_mm256_set1_ps(x); 2]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> [__m256; 2] {
        // SAFETY: the trait's contract (16 lanes).
        unsafe { [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8))] }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, x: [__m256; 2]) {
        // SAFETY: the trait's contract (16 lanes).
        unsafe {
            _mm256_storeu_ps(p, x[0]);
            _mm256_storeu_ps(p.add(8), x[1]);
        }
    }
    #[inline(always)]
    unsafe fn load_masked(src: [__m256; 2], m: u16, p: *const f32) -> [__m256; 2] {
        // SAFETY: the trait's contract; maskload reads only the lanes of m.
        unsafe {
            let (k0, k1) = (lanes_of(m, 0), lanes_of(m, 8));
            let x0 = _mm256_maskload_ps(p, k0);
            let x1 = _mm256_maskload_ps(p.add(8), k1);
            [
                _mm256_blendv_ps(src[0], x0, _mm256_castsi256_ps(k0)),
                _mm256_blendv_ps(src[1], x1, _mm256_castsi256_ps(k1)),
            ]
        }
    }
    #[inline(always)]
    unsafe fn add(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        [_mm256_add_ps(a[0], b[0]), _mm256_add_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn sub(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        [_mm256_sub_ps(a[0], b[0]), _mm256_sub_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn mul(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        [_mm256_mul_ps(a[0], b[0]), _mm256_mul_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn div(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        [_mm256_div_ps(a[0], b[0]), _mm256_div_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn sqrt(x: [__m256; 2]) -> [__m256; 2] {
        [_mm256_sqrt_ps(x[0]), _mm256_sqrt_ps(x[1])]
    }
    #[inline(always)]
    unsafe fn fmadd(a: [__m256; 2], b: [__m256; 2], c: [__m256; 2]) -> [__m256; 2] {
        [
            _mm256_fmadd_ps(a[0], b[0], c[0]),
            _mm256_fmadd_ps(a[1], b[1], c[1]),
        ]
    }
    #[inline(always)]
    unsafe fn max(a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        // vmaxps on both: the second operand where either is NaN or both are zeros, as
        // AVX-512's.
        [_mm256_max_ps(a[0], b[0]), _mm256_max_ps(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn blend(m: u16, a: [__m256; 2], b: [__m256; 2]) -> [__m256; 2] {
        [
            _mm256_blendv_ps(a[0], b[0], _mm256_castsi256_ps(lanes_of(m, 0))),
            _mm256_blendv_ps(a[1], b[1], _mm256_castsi256_ps(lanes_of(m, 8))),
        ]
    }
    #[inline(always)]
    unsafe fn ne(a: [__m256; 2], b: [__m256; 2]) -> u16 {
        bits_of(
            _mm256_cmp_ps::<_CMP_NEQ_UQ>(a[0], b[0]),
            _mm256_cmp_ps::<_CMP_NEQ_UQ>(a[1], b[1]),
        )
    }
    #[inline(always)]
    unsafe fn gt(a: [__m256; 2], b: [__m256; 2]) -> u16 {
        bits_of(
            _mm256_cmp_ps::<_CMP_GT_OQ>(a[0], b[0]),
            _mm256_cmp_ps::<_CMP_GT_OQ>(a[1], b[1]),
        )
    }
    #[inline(always)]
    unsafe fn exp(x: [__m256; 2]) -> [__m256; 2] {
        // SAFETY: AVX2 + FMA (the trait's contract).
        unsafe { [vexp::exp8_avx2(x[0]), vexp::exp8_avx2(x[1])] }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const i32) -> [__m256i; 2] {
        // SAFETY: the trait's contract (16 lanes).
        unsafe {
            [
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_si256(p.add(8) as *const __m256i),
            ]
        }
    }
    #[inline(always)]
    unsafe fn splat_i(x: i32) -> [__m256i; 2] {
        [_mm256_set1_epi32(x); 2]
    }
    #[inline(always)]
    unsafe fn add_i(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        [_mm256_add_epi32(a[0], b[0]), _mm256_add_epi32(a[1], b[1])]
    }
    #[inline(always)]
    unsafe fn ge_i(a: [__m256i; 2], b: [__m256i; 2]) -> u16 {
        // a >= b is not (b > a).
        !Self::lt_i(a, b)
    }
    #[inline(always)]
    unsafe fn lt_i(a: [__m256i; 2], b: [__m256i; 2]) -> u16 {
        let (lo, hi) = (
            _mm256_cmpgt_epi32(b[0], a[0]),
            _mm256_cmpgt_epi32(b[1], a[1]),
        );
        // SAFETY: AVX (the trait's contract).
        unsafe { bits_of(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi)) }
    }
    #[inline(always)]
    unsafe fn gather(src: [__m256; 2], m: u16, idx: [__m256i; 2], base: *const f32) -> [__m256; 2] {
        // SAFETY: the trait's contract; masked-off lanes are not read.
        unsafe {
            [
                _mm256_mask_i32gather_ps::<4>(
                    src[0],
                    base,
                    idx[0],
                    _mm256_castsi256_ps(lanes_of(m, 0)),
                ),
                _mm256_mask_i32gather_ps::<4>(
                    src[1],
                    base,
                    idx[1],
                    _mm256_castsi256_ps(lanes_of(m, 8)),
                ),
            ]
        }
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u8) -> [__m256; 2] {
        // SAFETY: the trait's contract (16 f16s).
        unsafe {
            [
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(16) as *const __m128i)),
            ]
        }
    }
}
