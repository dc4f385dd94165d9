//! AVX2 + FMA + F16C dot products of Q5_0 with Q8_0 and Q5_1 with Q8_1.
//!
//! Safety contract of this file: the `unsafe fn`s with `#[target_feature]` are reached only
//! through `super::avx2::dot_fn`, which `super::dot_fn_for` calls only after detecting AVX2,
//! FMA and F16C; `x` is a whole number of blocks and `y` holds as many activation blocks (the
//! matmul kernel sizes both from the same layout), which bounds every load below.
//!
//! A Q5 block holds 32 five-bit values: the low 4 bits packed as in Q4_0 (16 bytes, element j
//! in the low nibble of byte j, element j + 16 in its high nibble) and bit 4 of element j at
//! bit j of a little-endian u32 `qh`.

use std::arch::x86_64::*;

use super::avx2::{d_product, hsum, nibbles};

/// The 32 five-bit values (0..31) of a Q5 block, element j in byte j, from its `qh` at `qh`
/// and its 16 nibble bytes at `qs`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn values5(qh: *const u8, qs: *const u8) -> __m256i {
    // SAFETY: the caller passes 4 readable bytes at `qh` and 16 at `qs`.
    let (bits, low) = unsafe { ((qh as *const u32).read_unaligned(), nibbles(qs)) };
    // Byte j gets byte j / 8 of qh (the shuffle works per 128-bit lane, and both lanes hold
    // the whole u32), then keeps only bit j % 8, which becomes 0x10 if set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
}

/// Q5_0 (22 bytes): f16 `d` at 0, `qh` at 2, nibbles at 6; `x = d·(q − 16)`. Q8_0 (34 bytes):
/// f16 `d` at 0, 32 i8 at 2. `Σ (q − 16)·y` is computed as `Σ q·y − Σ 16·y` in i16 pair
/// sums (each at most 2·31·128 and 2·16·128 in magnitude, so neither the products nor their
/// difference leave i16).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 22;
    debug_assert_eq!(y.len(), n * 34);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let (sixteen, ones) = (_mm256_set1_epi8(16), _mm256_set1_epi16(1));
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 22), yp.add(i * 34));
            let d = _mm256_set1_ps(d_product(xb, yb));
            let q = values5(xb.add(2), xb.add(6));
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            let pairs = _mm256_sub_epi16(
                _mm256_maddubs_epi16(q, qy),
                _mm256_maddubs_epi16(sixteen, qy),
            );
            let s = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
            acc = _mm256_fmadd_ps(d, s, acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

/// Q5_1 (24 bytes): f16 `d` at 0, f16 `m` at 2, `qh` at 4, nibbles at 8; `x = d·q + m`.
/// Q8_1 (36 bytes): f16 `d` at 0, f16 `s = d·Σq` at 2, 32 i8 at 4. The block's dot is
/// `d·dy·Σ q·y + m·s`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 24;
    debug_assert_eq!(y.len(), n * 36);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 24), yp.add(i * 36));
            let d = _mm256_set1_ps(d_product(xb, yb));
            mins += d_product(xb.add(2), yb.add(2));
            let q = values5(xb.add(4), xb.add(8));
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            let s = _mm256_madd_epi16(_mm256_maddubs_epi16(q, qy), ones);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) + mins }
}
