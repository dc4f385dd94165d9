//! AVX2 + FMA + F16C dot products of the K-quants (Q2_K … Q6_K) with Q8_K.
//!
//! Safety contract of this file: the `unsafe fn`s with `#[target_feature]` are reached only
//! through `super::avx2::dot_fn`, which `super::dot_fn_for` calls only after detecting AVX2,
//! FMA and F16C; `x` is a whole number of weight super-blocks and `y` holds as many Q8_K
//! blocks (the matmul kernel sizes both from the same layout), which bounds every load below.
//!
//! All kernels share one plan. A super-block holds 256 values in sub-blocks of 16 or 32, with
//! `x = d·scale[s]·q − dmin·min[s]`. The values are unpacked 32 at a time into *unsigned*
//! bytes (at most 63), multiplied with the matching 32 Q8_K bytes by `maddubs` (pair sums at
//! most 2·63·128, inside i16), then `madd` with the sub-block scale(s) as i16 gives i32 lanes.
//! Formats whose values are signed (Q3_K, Q6_K) are unpacked with an offset `o` added, and
//! `o·Σ scale[s]·Σy[s]` is subtracted using Q8_K's `bsums`; minimums (Q2_K, Q4_K, Q5_K) use
//! the same `bsums`. Each super-block's sums are reduced to exact i32 and scaled once, in the
//! same order of float operations as the scalar reference.
//!
//! Q8_K block (292 bytes): f32 `d` at 0, 256 `i8` at 4, 16 `i16` bsums (Σ of each 16) at 260.

use std::arch::x86_64::*;

use super::avx2::f16_at;

pub(super) const Q8K_BYTES: usize = 292;
pub(super) const Q8K_QS: usize = 4;
pub(super) const Q8K_BSUMS: usize = 260;

/// The sum of the eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// i16 scale `lo` in the low 128-bit lane, `hi` in the high one (a pair of 16-element
/// sub-blocks covered by one 32-byte vector).
#[inline]
#[target_feature(enable = "avx2")]
fn pair_scales(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// Σ q·y per pair of bytes, times the i16 scales `sc`, as 8 i32 lanes (`q` unsigned ≤ 63).
#[inline]
#[target_feature(enable = "avx2")]
fn dot_scaled(q: __m256i, y: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(q, y), sc)
}

/// 32 bytes at `p`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 32 readable bytes.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The f32 scale of the Q8_K block at `yb`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn q8k_d(yb: *const u8) -> f32 {
    // SAFETY: the caller passes a whole Q8_K block.
    unsafe { (yb as *const f32).read_unaligned() }
}

/// Σ w[g]·bsum[g] over the 16 groups of 16 of the Q8_K block at `yb` (`w` as 16 i16).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn bsums_dot(yb: *const u8, w: __m256i) -> i32 {
    // SAFETY: the caller passes a whole Q8_K block; its bsums are its last 32 bytes.
    let bs = unsafe { load32(yb.add(Q8K_BSUMS)) };
    hsum_i32(_mm256_madd_epi16(bs, w))
}

/// Q4_K/Q5_K's 12 packed bytes as (8 six-bit scales, 8 six-bit minimums), one per byte.
///
/// Bytes 0..4 hold scales 0..3 (low 6 bits) and bytes 4..8 minimums 0..3; bytes 8..12 hold
/// the low 4 bits of scale 4+k (low nibble) and minimum 4+k (high nibble), whose top 2 bits are
/// the top 2 bits of bytes k and 4+k.
#[inline]
pub(super) fn scales_mins_k4(s: [u8; 12]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (w0, w1, w2) = (w(0), w(4), w(8));
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let sc_hi = (w2 & LOW4) | (((w0 >> 6) & LOW2) << 4);
    let mn_hi = ((w2 >> 4) & LOW4) | (((w1 >> 6) & LOW2) << 4);
    let join = |lo: u32, hi: u32| (u64::from(lo) | (u64::from(hi) << 32)).to_le_bytes();
    (join(w0 & LOW6, sc_hi), join(w1 & LOW6, mn_hi))
}

/// 8 minimums duplicated per 16-element group, as 16 i16 (for [`bsums_dot`]).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn mins_per_group(mins: [u8; 8]) -> __m256i {
    let m = _mm_cvtsi64_si128(i64::from_le_bytes(mins));
    _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m, m))
}

/// Q4_K (144 bytes): f16 `d` at 0, f16 `dmin` at 2, packed scales/minimums at 4 (see
/// [`scales_mins_k4`]), 128 bytes of nibbles at 16. Chunk c (64 values) is bytes
/// `16 + 32c ..`: low nibbles are sub-block 2c, high nibbles sub-block 2c+1 (32 values each).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    const BYTES: usize = 144;
    let n = x.len() / BYTES;
    debug_assert_eq!(y.len(), n * Q8K_BYTES);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let mut sum = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract), and every offset below
        // stays inside its block.
        unsafe {
            let (xb, yb) = (xp.add(i * BYTES), yp.add(i * Q8K_BYTES));
            let (d, dmin, dy) = (f16_at(xb), f16_at(xb.add(2)), q8k_d(yb));
            let (sc, mn) = scales_mins_k4((xb.add(4) as *const [u8; 12]).read_unaligned());
            let mut acc = _mm256_setzero_si256();
            for c in 0..4 {
                let q = load32(xb.add(16 + 32 * c));
                let y0 = load32(yb.add(Q8K_QS + 64 * c));
                let y1 = load32(yb.add(Q8K_QS + 64 * c + 32));
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                let s0 = _mm256_set1_epi16(i16::from(sc[2 * c]));
                let s1 = _mm256_set1_epi16(i16::from(sc[2 * c + 1]));
                acc = _mm256_add_epi32(acc, dot_scaled(lo, y0, s0));
                acc = _mm256_add_epi32(acc, dot_scaled(hi, y1, s1));
            }
            let sum_q = hsum_i32(acc);
            let sum_m = bsums_dot(yb, mins_per_group(mn));
            sum += d * dy * sum_q as f32 - dmin * dy * sum_m as f32;
        }
    }
    sum
}

/// Q5_K (176 bytes): Q4_K's header (d, dmin, 12 scale bytes), then `qh` (32 bytes) at 16 and
/// the nibbles at 48 laid out as in Q4_K. Bit 2c of `qh[l]` is bit 4 of value l of sub-block
/// 2c, bit 2c+1 that of sub-block 2c+1.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    const BYTES: usize = 176;
    let n = x.len() / BYTES;
    debug_assert_eq!(y.len(), n * Q8K_BYTES);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let (m4, bit4) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let mut sum = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract), and every offset below
        // stays inside its block.
        unsafe {
            let (xb, yb) = (xp.add(i * BYTES), yp.add(i * Q8K_BYTES));
            let (d, dmin, dy) = (f16_at(xb), f16_at(xb.add(2)), q8k_d(yb));
            let (sc, mn) = scales_mins_k4((xb.add(4) as *const [u8; 12]).read_unaligned());
            // Shifted right by 2 per chunk, so chunk c's two bits are always bits 0 and 1 of
            // each byte (the bits shifted in from the next byte only reach bits 2..8).
            let mut qh = load32(xb.add(16));
            let mut acc = _mm256_setzero_si256();
            for c in 0..4 {
                let q = load32(xb.add(48 + 32 * c));
                let y0 = load32(yb.add(Q8K_QS + 64 * c));
                let y1 = load32(yb.add(Q8K_QS + 64 * c + 32));
                // Bit 0 → bit 4 and bit 1 → bit 4 (16-bit shifts: what crosses into the next
                // byte lands in its bits 0..4 and is masked off).
                let h0 = _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4);
                let h1 = _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4);
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
                let s0 = _mm256_set1_epi16(i16::from(sc[2 * c]));
                let s1 = _mm256_set1_epi16(i16::from(sc[2 * c + 1]));
                acc = _mm256_add_epi32(acc, dot_scaled(lo, y0, s0));
                acc = _mm256_add_epi32(acc, dot_scaled(hi, y1, s1));
                qh = _mm256_srli_epi16(qh, 2);
            }
            let sum_q = hsum_i32(acc);
            let sum_m = bsums_dot(yb, mins_per_group(mn));
            sum += d * dy * sum_q as f32 - dmin * dy * sum_m as f32;
        }
    }
    sum
}

/// Q6_K (210 bytes): `ql` (128) at 0, `qh` (64) at 128, 16 i8 scales at 192, f16 `d` at 208.
/// Half h (128 values) uses `ql[64h..64h+64]` and `qh[32h..32h+32]`; its value `32k + l` is
/// nibble `k / 2` of `ql[64h + l + 32 (k % 2)]` with bits `2k..2k+2` of `qh[32h + l]` on top,
/// minus 32. Sub-blocks have 16 values, so each 32-value vector `k` spans sub-blocks
/// `8h + 2k` (low lane) and `8h + 2k + 1` (high lane). Values are used unsigned (0..63) and
/// `32·Σ scale[s]·bsum[s]` is subtracted.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    const BYTES: usize = 210;
    let n = x.len() / BYTES;
    debug_assert_eq!(y.len(), n * Q8K_BYTES);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let mut sum = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract), and every offset below
        // stays inside its block.
        unsafe {
            let (xb, yb) = (xp.add(i * BYTES), yp.add(i * Q8K_BYTES));
            let (d, dy) = (f16_at(xb.add(208)), q8k_d(yb));
            let sc = (xb.add(192) as *const [i8; 16]).read_unaligned();
            let mut acc = _mm256_setzero_si256();
            for h in 0..2 {
                let ql0 = load32(xb.add(64 * h));
                let ql1 = load32(xb.add(64 * h + 32));
                let qh = load32(xb.add(128 + 32 * h));
                // Bits 2k..2k+2 of qh moved to bits 4..6 (16-bit shifts; what crosses a byte
                // boundary is masked off).
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 4), m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16(qh, 2), m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                        _mm256_and_si256(qh, m2),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                        _mm256_and_si256(_mm256_srli_epi16(qh, 2), m2),
                    ),
                ];
                for (k, &q) in q.iter().enumerate() {
                    let yv = load32(yb.add(Q8K_QS + 128 * h + 32 * k));
                    let s = 8 * h + 2 * k;
                    let scales = pair_scales(i16::from(sc[s]), i16::from(sc[s + 1]));
                    acc = _mm256_add_epi32(acc, dot_scaled(q, yv, scales));
                }
            }
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(192) as *const __m128i));
            let sum_q = hsum_i32(acc) - 32 * bsums_dot(yb, sc16);
            sum += d * dy * sum_q as f32;
        }
    }
    sum
}

/// Q3_K's 12 scale bytes as 16 signed scales (6 bits, offset 32). Scale i (group g = i / 4)
/// has its low 4 bits in byte i (low nibble) for i < 8 or byte i − 8 (high nibble) otherwise,
/// and its top 2 bits at bits 2g..2g+2 of byte 8 + i % 4.
#[inline]
pub(super) fn scales_q3k(s: [u8; 12]) -> [i8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[i], s[i + 1], s[i + 2], s[i + 3]]);
    let (w0, w1, w2) = (w(0), w(4), w(8));
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let low = [w0 & LOW4, w1 & LOW4, (w0 >> 4) & LOW4, (w1 >> 4) & LOW4];
    let mut out = [0i8; 16];
    for (g, &lo) in low.iter().enumerate() {
        let six = lo | (((w2 >> (2 * g)) & LOW2) << 4);
        for (o, b) in out[4 * g..4 * g + 4].iter_mut().zip(six.to_le_bytes()) {
            *o = b as i8 - 32;
        }
    }
    out
}

/// Q3_K (110 bytes): `hmask` (32) at 0, `qs` (64) at 32, 12 scale bytes at 96 (see
/// [`scales_q3k`]), f16 `d` at 108. Half h's value `32p + l` has its low 2 bits at bits
/// `2p..2p+2` of `qs[32h + l]` and a high bit at bit `4h + p` of `hmask[l]`; the value is
/// `low − 4` when that bit is clear, `low` when set. It is used unsigned as `low + 4·bit`
/// (0..7) and `4·Σ scale[s]·bsum[s]` is subtracted. Sub-blocks of 16 as in Q6_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    const BYTES: usize = 110;
    let n = x.len() / BYTES;
    debug_assert_eq!(y.len(), n * Q8K_BYTES);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let (m3, bit2) = (_mm256_set1_epi8(0x03), _mm256_set1_epi8(0x04));
    let mut sum = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract), and every offset below
        // stays inside its block.
        unsafe {
            let (xb, yb) = (xp.add(i * BYTES), yp.add(i * Q8K_BYTES));
            let (d, dy) = (f16_at(xb.add(108)), q8k_d(yb));
            let sc = scales_q3k((xb.add(96) as *const [u8; 12]).read_unaligned());
            // Shifted right by 1 per pass (8 passes in all), so the current high bit is bit 0
            // of each byte; bits shifted in from the next byte only reach bits 1..8.
            let mut hm = load32(xb);
            let mut acc = _mm256_setzero_si256();
            for h in 0..2 {
                // Shifted right by 2 per pass: the current 2 bits are bits 0..2 of each byte.
                let mut qs = load32(xb.add(32 + 32 * h));
                for p in 0..4 {
                    let high = _mm256_and_si256(_mm256_slli_epi16(hm, 2), bit2);
                    let q = _mm256_or_si256(_mm256_and_si256(qs, m3), high);
                    let yv = load32(yb.add(Q8K_QS + 128 * h + 32 * p));
                    let s = 8 * h + 2 * p;
                    let scales = pair_scales(i16::from(sc[s]), i16::from(sc[s + 1]));
                    acc = _mm256_add_epi32(acc, dot_scaled(q, yv, scales));
                    qs = _mm256_srli_epi16(qs, 2);
                    hm = _mm256_srli_epi16(hm, 1);
                }
            }
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr() as *const __m128i));
            let sum_q = hsum_i32(acc) - 4 * bsums_dot(yb, sc16);
            sum += d * dy * sum_q as f32;
        }
    }
    sum
}

/// Q2_K (84 bytes): 16 scale bytes at 0 (low nibble: scale, high nibble: minimum of sub-block
/// s), `qs` (64) at 16, f16 `d` at 80, f16 `dmin` at 82. Half h's value `32p + l` is bits
/// `2p..2p+2` of `qs[32h + l]`. Sub-blocks of 16 as in Q6_K.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    const BYTES: usize = 84;
    let n = x.len() / BYTES;
    debug_assert_eq!(y.len(), n * Q8K_BYTES);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let (m3, m4) = (_mm256_set1_epi8(0x03), _mm_set1_epi8(0x0F));
    let mut sum = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract), and every offset below
        // stays inside its block.
        unsafe {
            let (xb, yb) = (xp.add(i * BYTES), yp.add(i * Q8K_BYTES));
            let (d, dmin, dy) = (f16_at(xb.add(80)), f16_at(xb.add(82)), q8k_d(yb));
            let sm = (xb as *const [u8; 16]).read_unaligned();
            let mut acc = _mm256_setzero_si256();
            for h in 0..2 {
                // Shifted right by 2 per pass: the current 2 bits are bits 0..2 of each byte.
                let mut qs = load32(xb.add(16 + 32 * h));
                for p in 0..4 {
                    let q = _mm256_and_si256(qs, m3);
                    let yv = load32(yb.add(Q8K_QS + 128 * h + 32 * p));
                    let s = 8 * h + 2 * p;
                    let scales = pair_scales(i16::from(sm[s] & 0x0F), i16::from(sm[s + 1] & 0x0F));
                    acc = _mm256_add_epi32(acc, dot_scaled(q, yv, scales));
                    qs = _mm256_srli_epi16(qs, 2);
                }
            }
            let packed = _mm_loadu_si128(xb as *const __m128i);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
            let sum_q = hsum_i32(acc);
            let sum_m = bsums_dot(yb, mins);
            sum += d * dy * sum_q as f32 - dmin * dy * sum_m as f32;
        }
    }
    sum
}
