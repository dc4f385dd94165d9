//! AVX-512 VNNI dot products (256-bit `vpdpbusd`: four u8·i8 products summed into each i32 lane
//! in one instruction).
//!
//! Safety contract of this file: reached only through [`dot_fn`], which `super::dot_fn_for`
//! calls only after detecting AVX-512 F/BW/VL/VNNI (and AVX2/FMA/F16C); rows are whole blocks
//! and `y` has as many elements as `x`.

use std::arch::x86_64::*;

use tinynn_format::GgmlType;

use super::avx2::{f16_at, hsum, nibbles};
use super::DotFn;

pub(super) fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    // SAFETY (for each closure): the CPU has the features (see the file's contract).
    match ty {
        GgmlType::Q4_0 => Some(|x, y| unsafe { q4_0_q8_0(x, y) }),
        GgmlType::Q4_1 => Some(|x, y| unsafe { q4_1_q8_1(x, y) }),
        GgmlType::Q8_0 => Some(|x, y| unsafe { q8_0_q8_0(x, y) }),
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
            let d = _mm256_set1_ps(f16_at(xb) * f16_at(yb));
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
            let d = _mm256_set1_ps(f16_at(xb) * f16_at(yb));
            mins += f16_at(xb.add(2)) * f16_at(yb.add(2));
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
            let d = _mm256_set1_ps(f16_at(xb) * f16_at(yb));
            let qx = _mm256_loadu_si256(xb.add(2) as *const __m256i);
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            let s = dpbusd(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc);
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    unsafe { hsum(acc) }
}
