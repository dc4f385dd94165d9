//! AVX-512 VNNI dot products of the K-quants (Q2_K … Q6_K) with Q8_K, in 256-bit registers.
//!
//! Safety contract of this file: the `unsafe fn`s with `#[target_feature]` are reached only
//! through `super::avx512::dot_fn`, which `super::dot_fn_for` calls only after detecting
//! AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C; `x` is a whole number of weight super-blocks and `y`
//! holds as many Q8_K blocks (the matmul kernel sizes both from the same layout), which bounds
//! every load below.
//!
//! The plan is the AVX2 one (see `avx2_kquants`): values unpacked 32 at a time into unsigned
//! bytes (at most 63), signed values offset and corrected with Q8_K's `bsums`, minimums folded
//! in through the same `bsums`, one exact i32 per super-block scaled once in the reference's
//! order of float operations. Only the scaled dot changes ([`dot_pair`]): `vpdpbusd` sums four
//! u8·i8 products per i32 lane, at most 4·63·128 = 32256 in magnitude, so two such vectors
//! pack into one vector of i16 without saturating (`vpackssdw`), and one `vpmaddwd` with the
//! matching i16 sub-block scales ([`pick`]) turns it back into i32 lanes, each the scaled sum
//! of 8 products of one sub-block (at most 2·32256·128 in magnitude). Per 64 values that is 2
//! `vpdpbusd`, 1 pack, 1 scale shuffle, 1 `vpmaddwd` and 1 add, where AVX2 needs 2
//! `vpmaddubsw`, 2 `vpmaddwd`, 2 adds and the scale broadcasts; no step can saturate or wrap,
//! so each super-block's i32 equals the reference's.
//!
//! Lane bookkeeping: `vpackssdw a, b` keeps 128-bit lanes apart, so its low lane holds a's low
//! lane then b's low lane (4 i16 each) and its high lane a's high lane then b's. A 32-byte
//! vector covers one 32-value sub-block (Q4_K, Q5_K: the same scale in both lanes) or two
//! 16-value sub-blocks (Q2_K, Q3_K, Q6_K: the first in the low lane, the second in the high
//! one), and the scale vector is laid out to match.

use std::arch::x86_64::*;

use super::avx2::f16_at;
use super::avx2_kquants::{
    bsums_dot, hsum_i32, load32, mins_per_group, q8k_d, scales_mins_k4, Q8K_BYTES, Q8K_QS,
};

/// `acc + Σ qa·ya · (scale of the lane) + Σ qb·yb · (scale of the lane)` per i32 lane: `qa`,
/// `qb` unsigned ≤ 63, `ya`, `yb` signed, `sc` 16 i16 scales laid out as [`pick`] makes them.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
fn dot_pair(
    acc: __m256i,
    (qa, ya): (__m256i, __m256i),
    (qb, yb): (__m256i, __m256i),
    sc: __m256i,
) -> __m256i {
    let da = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qa, ya);
    let db = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qb, yb);
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_packs_epi32(da, db), sc))
}

/// The `vpshufb` control for [`pick`].
const fn pick_control(a_lo: i8, b_lo: i8, a_hi: i8, b_hi: i8) -> [i8; 32] {
    let mut c = [0i8; 32];
    let mut t = 0;
    while t < 16 {
        let s = match (t / 8, t % 8 >= 4) {
            (0, false) => a_lo,
            (0, true) => b_lo,
            (_, false) => a_hi,
            (_, true) => b_hi,
        };
        c[2 * t] = 2 * s;
        c[2 * t + 1] = 2 * s + 1;
        t += 1;
    }
    c
}

/// The scale vector for [`dot_pair`] from `s`, 8 i16 scales repeated in both 128-bit lanes:
/// low lane `[s[A_LO]; 4], [s[B_LO]; 4]` (for the low lanes of the vectors `a` and `b`), high
/// lane `[s[A_HI]; 4], [s[B_HI]; 4]`.
#[inline]
#[target_feature(enable = "avx2")]
fn pick<const A_LO: i8, const B_LO: i8, const A_HI: i8, const B_HI: i8>(s: __m256i) -> __m256i {
    let control = const { pick_control(A_LO, B_LO, A_HI, B_HI) };
    // SAFETY: reads the 32 bytes of a local array.
    _mm256_shuffle_epi8(s, unsafe {
        _mm256_loadu_si256(control.as_ptr() as *const __m256i)
    })
}

/// The two scale vectors of one half of a 16-value-sub-block format: `s` holds the half's 8
/// scales as i16 in both lanes; of the half's four 32-value vectors, vector k covers its
/// sub-blocks 2k (low lane) and 2k+1 (high lane), and the vectors go in pairs (0, 1), (2, 3).
#[inline]
#[target_feature(enable = "avx2")]
fn half_scales(s: __m256i) -> [__m256i; 2] {
    [pick::<0, 2, 1, 3>(s), pick::<4, 6, 5, 7>(s)]
}

/// 16 i16 scales (sub-blocks 0..8 in the low lane, 8..16 in the high one) as the scales of
/// each half, repeated in both lanes (for [`half_scales`]).
#[inline]
#[target_feature(enable = "avx2")]
fn halves(s: __m256i) -> [__m256i; 2] {
    [
        _mm256_permute2x128_si256::<0x00>(s, s),
        _mm256_permute2x128_si256::<0x11>(s, s),
    ]
}

/// The scale vectors of Q4_K/Q5_K's four 64-value chunks (chunk c: sub-block 2c in vector a,
/// 2c+1 in vector b, both lanes alike) from the 8 unsigned scales.
#[inline]
#[target_feature(enable = "avx2")]
fn chunk_scales(sc: [u8; 8]) -> [__m256i; 4] {
    let s =
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(i64::from_le_bytes(sc))));
    [
        pick::<0, 1, 0, 1>(s),
        pick::<2, 3, 2, 3>(s),
        pick::<4, 5, 4, 5>(s),
        pick::<6, 7, 6, 7>(s),
    ]
}

/// Q4_K (144 bytes): f16 `d` at 0, f16 `dmin` at 2, 12 packed scale/minimum bytes at 4, 128
/// bytes of nibbles at 16. Chunk c (64 values) is bytes `16 + 32c ..`: low nibbles are
/// sub-block 2c, high nibbles sub-block 2c+1 (32 values each).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let scales = chunk_scales(sc);
            let mut acc = _mm256_setzero_si256();
            for (c, &sc) in scales.iter().enumerate() {
                let q = load32(xb.add(16 + 32 * c));
                let y0 = load32(yb.add(Q8K_QS + 64 * c));
                let y1 = load32(yb.add(Q8K_QS + 64 * c + 32));
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                acc = dot_pair(acc, (lo, y0), (hi, y1), sc);
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let scales = chunk_scales(sc);
            // Shifted right by 2 per chunk, so chunk c's two bits are always bits 0 and 1 of
            // each byte (bits shifted in from the next byte only reach bits 2..8).
            let mut qh = load32(xb.add(16));
            let mut acc = _mm256_setzero_si256();
            for (c, &sc) in scales.iter().enumerate() {
                let q = load32(xb.add(48 + 32 * c));
                let y0 = load32(yb.add(Q8K_QS + 64 * c));
                let y1 = load32(yb.add(Q8K_QS + 64 * c + 32));
                // Bit 0 → bit 4 and bit 1 → bit 4 (16-bit shifts: what crosses into the next
                // byte lands in its bits 0..4 and is masked off).
                let h0 = _mm256_and_si256(_mm256_slli_epi16(qh, 4), bit4);
                let h1 = _mm256_and_si256(_mm256_slli_epi16(qh, 3), bit4);
                let lo = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
                let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
                acc = dot_pair(acc, (lo, y0), (hi, y1), sc);
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
/// minus 32. Sub-blocks have 16 values. Values are used unsigned (0..63) and
/// `32·Σ scale[s]·bsum[s]` is subtracted.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(xb.add(192) as *const __m128i));
            let mut acc = _mm256_setzero_si256();
            for (h, &half) in halves(sc16).iter().enumerate() {
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
                let yv = |k: usize| load32(yb.add(Q8K_QS + 128 * h + 32 * k));
                let [s01, s23] = half_scales(half);
                acc = dot_pair(acc, (q[0], yv(0)), (q[1], yv(1)), s01);
                acc = dot_pair(acc, (q[2], yv(2)), (q[3], yv(3)), s23);
            }
            let sum_q = hsum_i32(acc) - 32 * bsums_dot(yb, sc16);
            sum += d * dy * sum_q as f32;
        }
    }
    sum
}

/// Q3_K's 12 scale bytes at `p` as 16 i16 scales (6 bits, offset 32), decoded in 128-bit
/// registers (the scalar decoder, inlined here, is auto-vectorized into 512-bit instructions,
/// which slow the whole kernel down). Scale i (group g = i / 4) has its low 4 bits in byte i
/// (low nibble) for i < 8 or byte i − 8 (high nibble) otherwise, and its top 2 bits at bits
/// 2g..2g+2 of byte 8 + i % 4.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scales_q3k_i16(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 12 readable bytes.
    let (lo8, hi4) = unsafe {
        (
            _mm_loadl_epi64(p as *const __m128i),
            (p.add(8) as *const i32).read_unaligned(),
        )
    };
    let m4 = _mm_set1_epi8(0x0F);
    // Bytes 0..8: low nibbles of bytes 0..8 (scales 0..8); bytes 8..16: their high nibbles.
    let low = _mm_unpacklo_epi64(
        _mm_and_si128(lo8, m4),
        _mm_and_si128(_mm_srli_epi16(lo8, 4), m4),
    );
    // Dword g holds bytes 8..12, shifted right by 2g: byte 4g + j has scale 4g + j's top bits
    // in bits 0..2 (bits from the next byte land above and are masked off).
    let top = _mm_srlv_epi32(_mm_set1_epi32(hi4), _mm_setr_epi32(0, 2, 4, 6));
    let top = _mm_slli_epi16(_mm_and_si128(top, _mm_set1_epi8(0x03)), 4);
    let six = _mm_sub_epi8(_mm_or_si128(low, top), _mm_set1_epi8(32));
    _mm256_cvtepi8_epi16(six)
}

/// Q3_K (110 bytes): `hmask` (32) at 0, `qs` (64) at 32, 12 scale bytes at 96 (16 signed
/// 6-bit scales, see [`scales_q3k_i16`]), f16 `d` at 108. Half h's value `32p + l` has
/// its low 2 bits at bits `2p..2p+2` of `qs[32h + l]` and a high bit at bit `4h + p` of
/// `hmask[l]`; the value is `low − 4` when that bit is clear, `low` when set. It is used
/// unsigned as `low + 4·bit` (0..7) and `4·Σ scale[s]·bsum[s]` is subtracted. Sub-blocks of 16
/// as in Q6_K.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let sc16 = scales_q3k_i16(xb.add(96));
            // Shifted right by 1 per pass (8 passes in all), so the current high bit is bit 0
            // of each byte; bits shifted in from the next byte only reach bits 1..8.
            let mut hm = load32(xb);
            let mut acc = _mm256_setzero_si256();
            for (h, &half) in halves(sc16).iter().enumerate() {
                // Shifted right by 2 per pass: the current 2 bits are bits 0..2 of each byte.
                let mut qs = load32(xb.add(32 + 32 * h));
                let mut q = [_mm256_setzero_si256(); 4];
                for q in &mut q {
                    let high = _mm256_and_si256(_mm256_slli_epi16(hm, 2), bit2);
                    *q = _mm256_or_si256(_mm256_and_si256(qs, m3), high);
                    qs = _mm256_srli_epi16(qs, 2);
                    hm = _mm256_srli_epi16(hm, 1);
                }
                let yv = |p: usize| load32(yb.add(Q8K_QS + 128 * h + 32 * p));
                let [s01, s23] = half_scales(half);
                acc = dot_pair(acc, (q[0], yv(0)), (q[1], yv(1)), s01);
                acc = dot_pair(acc, (q[2], yv(2)), (q[3], yv(3)), s23);
            }
            let sum_q = hsum_i32(acc) - 4 * bsums_dot(yb, sc16);
            sum += d * dy * sum_q as f32;
        }
    }
    sum
}

/// Q2_K (84 bytes): 16 scale bytes at 0 (low nibble: scale, high nibble: minimum of sub-block
/// s), `qs` (64) at 16, f16 `d` at 80, f16 `dmin` at 82. Half h's value `32p + l` is bits
/// `2p..2p+2` of `qs[32h + l]`. Sub-blocks of 16 as in Q6_K.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let packed = _mm_loadu_si128(xb as *const __m128i);
            let sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(packed, m4));
            let mut acc = _mm256_setzero_si256();
            for (h, &half) in halves(sc16).iter().enumerate() {
                // Shifted right by 2 per pass: the current 2 bits are bits 0..2 of each byte.
                let mut qs = load32(xb.add(16 + 32 * h));
                let mut q = [_mm256_setzero_si256(); 4];
                for q in &mut q {
                    *q = _mm256_and_si256(qs, m3);
                    qs = _mm256_srli_epi16(qs, 2);
                }
                let yv = |p: usize| load32(yb.add(Q8K_QS + 128 * h + 32 * p));
                let [s01, s23] = half_scales(half);
                acc = dot_pair(acc, (q[0], yv(0)), (q[1], yv(1)), s01);
                acc = dot_pair(acc, (q[2], yv(2)), (q[3], yv(3)), s23);
            }
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
            let sum_q = hsum_i32(acc);
            let sum_m = bsums_dot(yb, mins);
            sum += d * dy * sum_q as f32 - dmin * dy * sum_m as f32;
        }
    }
    sum
}
