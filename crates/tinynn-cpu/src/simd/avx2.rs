//! AVX2 + FMA + F16C dot products.
//!
//! Safety contract of this file: the `unsafe fn`s with `#[target_feature]` are reached only
//! through [`dot_fn`], which `super::dot_fn_for` calls only after detecting AVX2, FMA and F16C;
//! row lengths are whole blocks and `y` has as many elements as `x` (the matmul kernel sizes
//! both from the same layout), which bounds every load below.

use std::arch::x86_64::*;

use tinynn_format::GgmlType;

use super::{avx2_kquants, avx2_q5, DotFn};

pub(super) fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    // SAFETY (for each closure): the CPU has AVX2/FMA/F16C (see the file's contract).
    match ty {
        GgmlType::F32 => Some(|x, y| unsafe { f32_f32(x, y) }),
        GgmlType::F16 => Some(|x, y| unsafe { f16_f16(x, y) }),
        GgmlType::Bf16 => Some(|x, y| unsafe { bf16_bf16(x, y) }),
        GgmlType::Q4_0 => Some(|x, y| unsafe { q4_0_q8_0(x, y) }),
        GgmlType::Q4_1 => Some(|x, y| unsafe { q4_1_q8_1(x, y) }),
        GgmlType::Q8_0 => Some(|x, y| unsafe { q8_0_q8_0(x, y) }),
        GgmlType::Q8_1 => Some(|x, y| unsafe { q8_1_q8_1(x, y) }),
        GgmlType::Q8K => Some(|x, y| unsafe { q8_k_q8_k(x, y) }),
        GgmlType::Q5_0 => Some(|x, y| unsafe { avx2_q5::q5_0_q8_0(x, y) }),
        GgmlType::Q5_1 => Some(|x, y| unsafe { avx2_q5::q5_1_q8_1(x, y) }),
        GgmlType::Q2K => Some(|x, y| unsafe { avx2_kquants::q2_k_q8_k(x, y) }),
        GgmlType::Q3K => Some(|x, y| unsafe { avx2_kquants::q3_k_q8_k(x, y) }),
        GgmlType::Q4K => Some(|x, y| unsafe { avx2_kquants::q4_k_q8_k(x, y) }),
        GgmlType::Q5K => Some(|x, y| unsafe { avx2_kquants::q5_k_q8_k(x, y) }),
        GgmlType::Q6K => Some(|x, y| unsafe { avx2_kquants::q6_k_q8_k(x, y) }),
        _ => None,
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// The f16 at `p`.
#[inline]
#[target_feature(enable = "f16c,avx2")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: the caller passes a pointer to two readable bytes.
    let bits = unsafe { (p as *const u16).read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

/// 16 bytes of nibbles as 32 u8: low nibbles in the low lane (elements 0..16), high nibbles
/// in the high lane (elements 16..32), the order of Q4/Q5 blocks.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 16 readable bytes.
    let b = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let m = _mm_set1_epi8(0x0F);
    _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m))
}

/// Σ u8·i8 over 32 pairs as 8 f32 lanes (no overflow for |products| ≤ 127·128).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_u8_i8(x: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(
        _mm256_maddubs_epi16(x, y),
        _mm256_set1_epi16(1),
    ))
}

/// Σ i8·i8 over 32 pairs: |x| · (y with x's sign). Exact unless `y` holds −128 where `x` is
/// negative (−(−128) wraps); the Q8 activation quantizers only emit −127..=127.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn dot_i8_i8(x: __m256i, y: __m256i) -> __m256 {
    unsafe { dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 18;
    debug_assert_eq!(y.len(), n * 34);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 18), yp.add(i * 34));
            let d = _mm256_set1_ps(d_product(xb, yb));
            let qx = _mm256_sub_epi8(nibbles(xb.add(2)), _mm256_set1_epi8(8));
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 20;
    debug_assert_eq!(y.len(), n * 36);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 20), yp.add(i * 36));
            let d = _mm256_set1_ps(d_product(xb, yb));
            mins += d_product(xb.add(2), yb.add(2));
            let qx = nibbles(xb.add(4));
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            acc = _mm256_fmadd_ps(d, dot_u8_i8(qx, qy), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) + mins }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 34;
    debug_assert_eq!(y.len(), n * 34);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 34), yp.add(i * 34));
            let d = _mm256_set1_ps(d_product(xb, yb));
            let qx = _mm256_loadu_si256(xb.add(2) as *const __m256i);
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn f32_f32(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 4;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr() as *const f32, y.as_ptr() as *const f32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads 8 floats below n (file contract: equal lengths).
    unsafe {
        while i + 32 <= n {
            for (j, a) in acc.iter_mut().enumerate() {
                let (xv, yv) = (
                    _mm256_loadu_ps(xp.add(i + 8 * j)),
                    _mm256_loadu_ps(yp.add(i + 8 * j)),
                );
                *a = _mm256_fmadd_ps(xv, yv, *a);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(xp.add(i)),
                _mm256_loadu_ps(yp.add(i)),
                acc[0],
            );
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += xp.add(i).read_unaligned() * yp.add(i).read_unaligned();
            i += 1;
        }
        s
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_f16(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 2;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: every load reads 8 halves below n (file contract: equal lengths).
    unsafe {
        let load = |p: *const u8, i: usize| {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i))
        };
        while i + 16 <= n {
            acc[0] = _mm256_fmadd_ps(load(xp, i), load(yp, i), acc[0]);
            acc[1] = _mm256_fmadd_ps(load(xp, i + 8), load(yp, i + 8), acc[1]);
            i += 16;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(load(xp, i), load(yp, i), acc[0]);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
        while i < n {
            s += f16_at(xp.add(2 * i)) * f16_at(yp.add(2 * i));
            i += 1;
        }
        s
    }
}

/// The product of the f16 scales at `xb` and `yb`, each read as the low half of a 32-bit load
/// (a zeroing `vmovd`: the 16-bit load of [`f16_at`] is merged into a register by `vpinsrw`,
/// which LLVM may pick as the loop's accumulator, chaining every block's scale conversion to
/// the previous block's FMA).
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn d_product(xb: *const u8, yb: *const u8) -> f32 {
    // SAFETY: the caller passes 4 readable bytes at each pointer.
    let (dx, dy) = unsafe {
        (
            _mm_cvtsi32_si128((xb as *const i32).read_unaligned()),
            _mm_cvtsi32_si128((yb as *const i32).read_unaligned()),
        )
    };
    let d = _mm_cvtph_ps(_mm_unpacklo_epi16(dx, dy));
    _mm_cvtss_f32(_mm_mul_ss(d, _mm_movehdup_ps(d)))
}

/// Q8_1 (36 bytes): f16 `d` at 0, f16 `s = d·Σq` at 2 (unused here), 32 i8 at 4; the block's
/// dot is `d·dy·Σ q·y`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 36;
    debug_assert_eq!(y.len(), n * 36);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 36), yp.add(i * 36));
            let d = _mm256_set1_ps(d_product(xb, yb));
            let qx = _mm256_loadu_si256(xb.add(4) as *const __m256i);
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            acc = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

/// Q8_K (292 bytes): f32 `d` at 0, 256 i8 at 4, 16 i16 group sums at 260 (unused here). Each
/// block's Σ q·y is summed exactly in i32 lanes (at most 8·4·128·128 each), then scaled by
/// `d·dy`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_k_q8_k(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 292;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract); the 8 loads of 32 bytes
        // cover the 256 values at 4..260.
        unsafe {
            let (xb, yb) = (xp.add(i * 292), yp.add(i * 292));
            let dx = (xb as *const f32).read_unaligned();
            let dy = (yb as *const f32).read_unaligned();
            let mut isum = _mm256_setzero_si256();
            for k in 0..8 {
                let qx = _mm256_loadu_si256(xb.add(4 + 32 * k) as *const __m256i);
                let qy = _mm256_loadu_si256(yb.add(4 + 32 * k) as *const __m256i);
                // |x| · (y with x's sign), as in `dot_i8_i8`, kept in i32.
                let pairs =
                    _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(pairs, ones));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy), _mm256_cvtepi32_ps(isum), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

/// bf16 is the top half of an f32: within each 32-bit lane of a 16-value load, the even
/// element (low half) becomes an f32 by a left shift of 16 and the odd one (high half) by
/// masking off the low half. Both rows are split the same way, so the products pair up.
#[target_feature(enable = "avx2,fma")]
unsafe fn bf16_bf16(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 2;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let high = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY: every load reads 16 bf16 values below n (file contract: equal lengths).
    unsafe {
        let load = |p: *const u8, i: usize| {
            let v = _mm256_loadu_si256(p.add(2 * i) as *const __m256i);
            (
                _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
                _mm256_castsi256_ps(_mm256_and_si256(v, high)),
            )
        };
        while i + 32 <= n {
            let ((x0, x1), (y0, y1)) = (load(xp, i), load(yp, i));
            let ((x2, x3), (y2, y3)) = (load(xp, i + 16), load(yp, i + 16));
            acc[0] = _mm256_fmadd_ps(x0, y0, acc[0]);
            acc[1] = _mm256_fmadd_ps(x1, y1, acc[1]);
            acc[2] = _mm256_fmadd_ps(x2, y2, acc[2]);
            acc[3] = _mm256_fmadd_ps(x3, y3, acc[3]);
            i += 32;
        }
        while i + 16 <= n {
            let ((x0, x1), (y0, y1)) = (load(xp, i), load(yp, i));
            acc[0] = _mm256_fmadd_ps(x0, y0, acc[0]);
            acc[1] = _mm256_fmadd_ps(x1, y1, acc[1]);
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        let bf = |p: *const u8, i: usize| {
            f32::from_bits(u32::from((p.add(2 * i) as *const u16).read_unaligned()) << 16)
        };
        while i < n {
            s += bf(xp, i) * bf(yp, i);
            i += 1;
        }
        s
    }
}
