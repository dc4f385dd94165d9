//! AVX-512 VNNI dot products (256-bit `vpdpbusd`: four u8·i8 products summed into each i32 lane
//! in one instruction).
//!
//! Safety contract of this file: reached only through [`dot_fn`], which `super::dot_fn_for`
//! calls only at `Isa::Avx512Vnni` (AVX-512 F/BW/VL/DQ/VNNI, and AVX2/FMA/F16C) or above
//! ([`bf16_dot_fn`] at `Isa::Avx512Bf16`); rows are whole blocks
//! and `y` has as many elements as `x`.

use std::arch::x86_64::*;

use tinynn_format::GgmlType;

use super::avx2::{d_product, f16_at, hsum, nibbles};
use super::avx2_q5::values5;
use super::{avx512_kquants, DotFn};

pub(super) fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    // SAFETY (for each closure): the CPU has the features (see the file's contract).
    match ty {
        GgmlType::Q4_0 => Some(|x, y| unsafe { q4_0_q8_0(x, y) }),
        GgmlType::Q4_1 => Some(|x, y| unsafe { q4_1_q8_1(x, y) }),
        GgmlType::Q8_0 => Some(|x, y| unsafe { q8_0_q8_0(x, y) }),
        GgmlType::Q5_0 => Some(|x, y| unsafe { q5_0_q8_0(x, y) }),
        GgmlType::Q5_1 => Some(|x, y| unsafe { q5_1_q8_1(x, y) }),
        GgmlType::F32 => Some(|x, y| unsafe { f32_f32(x, y) }),
        GgmlType::F16 => Some(|x, y| unsafe { f16_f16(x, y) }),
        GgmlType::Q4K => Some(|x, y| unsafe { avx512_kquants::q4_k_q8_k(x, y) }),
        GgmlType::Q6K => Some(|x, y| unsafe { avx512_kquants::q6_k_q8_k(x, y) }),
        GgmlType::Q5K => Some(|x, y| unsafe { avx512_kquants::q5_k_q8_k(x, y) }),
        GgmlType::Q3K => Some(|x, y| unsafe { avx512_kquants::q3_k_q8_k(x, y) }),
        GgmlType::Q2K => Some(|x, y| unsafe { avx512_kquants::q2_k_q8_k(x, y) }),
        _ => None,
    }
}

/// The kernels that need AVX-512 BF16 too (handed out at `Isa::Avx512Bf16`, which the caller
/// checked this CPU runs); the other formats' are [`dot_fn`]'s.
pub(super) fn bf16_dot_fn(ty: GgmlType) -> Option<DotFn> {
    match ty {
        // SAFETY (closure): only handed out at Isa::Avx512Bf16 (AVX-512 F/BW/VL/VNNI + BF16).
        GgmlType::Bf16 => Some(|x, y| unsafe { bf16_bf16(x, y) }),
        _ => None,
    }
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
unsafe fn dpbusd(x_u8: __m256i, y_i8: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), x_u8, y_i8)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 18;
    debug_assert_eq!(y.len(), n * 34);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let eight = _mm256_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 18), yp.add(i * 34));
            let d = _mm256_set1_ps(d_product(xb, yb));
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            // Σ (q − 8)·y = Σ q·y − Σ 8·y.
            let s = _mm256_sub_epi32(dpbusd(nibbles(xb.add(2)), qy), dpbusd(eight, qy));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            let s = dpbusd(nibbles(xb.add(4)), qy);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) + mins }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
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
            let s = dpbusd(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_0_q8_0(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 22;
    debug_assert_eq!(y.len(), n * 34);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let sixteen = _mm256_set1_epi8(16);
    let mut acc = _mm256_setzero_ps();
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 22), yp.add(i * 34));
            let d = _mm256_set1_ps(d_product(xb, yb));
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            // Σ (q − 16)·y = Σ q·y − Σ 16·y, both with vpdpbusd (q ≤ 31 unsigned).
            let s = _mm256_sub_epi32(
                dpbusd(values5(xb.add(2), xb.add(6)), qy),
                dpbusd(sixteen, qy),
            );
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_1_q8_1(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 24;
    debug_assert_eq!(y.len(), n * 36);
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0.0f32;
    for i in 0..n {
        // SAFETY: block i of both rows is in bounds (file contract).
        unsafe {
            let (xb, yb) = (xp.add(i * 24), yp.add(i * 36));
            let d = _mm256_set1_ps(d_product(xb, yb));
            mins += d_product(xb.add(2), yb.add(2));
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            let s = dpbusd(values5(xb.add(4), xb.add(8)), qy);
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) + mins }
}

/// Sums the 16 lanes.
#[inline]
#[target_feature(enable = "avx512f")]
fn hsum512(v: __m512) -> f32 {
    super::hsum512::hsum(v)
}

#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn f32_f32(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 4;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr() as *const f32, y.as_ptr() as *const f32);
    let mut acc = [_mm512_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY: every load reads 16 floats below n (file contract: equal lengths).
    unsafe {
        while i + 32 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(xp.add(i)),
                _mm512_loadu_ps(yp.add(i)),
                acc[0],
            );
            acc[1] = _mm512_fmadd_ps(
                _mm512_loadu_ps(xp.add(i + 16)),
                _mm512_loadu_ps(yp.add(i + 16)),
                acc[1],
            );
            i += 32;
        }
        while i + 16 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(xp.add(i)),
                _mm512_loadu_ps(yp.add(i)),
                acc[0],
            );
            i += 16;
        }
        let mut s = hsum512(_mm512_add_ps(acc[0], acc[1]));
        while i < n {
            s += xp.add(i).read_unaligned() * yp.add(i).read_unaligned();
            i += 1;
        }
        s
    }
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn f16_f16(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 2;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: every load reads 16 halves below n (file contract: equal lengths).
    unsafe {
        let load = |p: *const u8, i: usize| {
            _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * i) as *const __m256i))
        };
        while i + 16 <= n {
            acc = _mm512_fmadd_ps(load(xp, i), load(yp, i), acc);
            i += 16;
        }
        let mut s = hsum512(acc);
        while i < n {
            s += f16_at(xp.add(2 * i)) * f16_at(yp.add(2 * i));
            i += 1;
        }
        s
    }
}

/// bf16 pairs multiplied and summed in f32 by `vdpbf16ps` (32 products per instruction).
#[target_feature(enable = "avx512bf16,avx512f,avx512bw,avx2")]
unsafe fn bf16_bf16(x: &[u8], y: &[u8]) -> f32 {
    let n = x.len() / 2;
    debug_assert_eq!(y.len(), x.len());
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    // SAFETY: every load reads 32 bf16 values below n (file contract: equal lengths); the
    // transmutes reinterpret 512 bits of bf16 pairs, which is what the intrinsic takes.
    unsafe {
        while i + 32 <= n {
            let a: __m512bh = std::mem::transmute(_mm512_loadu_si512(xp.add(2 * i) as *const _));
            let b: __m512bh = std::mem::transmute(_mm512_loadu_si512(yp.add(2 * i) as *const _));
            acc = _mm512_dpbf16_ps(acc, a, b);
            i += 32;
        }
        let mut s = hsum512(acc);
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
