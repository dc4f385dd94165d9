//! One weight row against four activation rows at once (AVX2 + FMA + F16C), for the matrix
//! products that run on the file's own layout: the weight block is loaded and unpacked once
//! for four rows, and the four independent accumulators keep the FMA units busy where one
//! row's sum waits on its previous block.
//!
//! Each of the four results is computed with exactly the operations, in the order, of the
//! one-row kernel of `avx2.rs` for that pair, so a product gives the same bits whether its
//! rows went four at a time (a prompt) or one at a time (decode).
//!
//! Safety contract of this file: as `avx2.rs` — reached only through [`dot4_fn`], which
//! `super::dot4_fn` calls only where the one-row kernel is `avx2.rs`'s (AVX2, FMA and F16C
//! detected); every row is whole blocks and each activation row has as many elements as `x`.

use std::arch::x86_64::*;

use tinynn_format::GgmlType;

use super::avx2::{d_product, dot_i8_i8, dot_u8_i8, hsum, nibbles};
use super::Dot4Fn;

pub(super) fn dot4_fn(ty: GgmlType) -> Option<Dot4Fn> {
    // SAFETY (for each closure): the CPU has AVX2/FMA/F16C (see the file's contract).
    match ty {
        GgmlType::Q4_0 => Some(|x, y| unsafe { q4_0_x4(x, y) }),
        GgmlType::Q4_1 => Some(|x, y| unsafe { q4_1_x4(x, y) }),
        GgmlType::Q8_0 => Some(|x, y| unsafe { q8_0_x4(x, y) }),
        _ => None,
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_x4(x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let n = x.len() / 18;
    debug_assert!(y.iter().all(|r| r.len() == n * 34));
    let (xp, yp) = (x.as_ptr(), y.map(<[u8]>::as_ptr));
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in 0..n {
        // SAFETY: block i of every row is in bounds (file contract).
        unsafe {
            let xb = xp.add(i * 18);
            let qx = _mm256_sub_epi8(nibbles(xb.add(2)), _mm256_set1_epi8(8));
            for (a, &y) in acc.iter_mut().zip(&yp) {
                let yb = y.add(i * 34);
                let d = _mm256_set1_ps(d_product(xb, yb));
                let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
                *a = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), *a);
            }
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    acc.map(|a| unsafe { hsum(a) })
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1_x4(x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let n = x.len() / 20;
    debug_assert!(y.iter().all(|r| r.len() == n * 36));
    let (xp, yp) = (x.as_ptr(), y.map(<[u8]>::as_ptr));
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut mins = [0f32; 4];
    for i in 0..n {
        // SAFETY: block i of every row is in bounds (file contract).
        unsafe {
            let xb = xp.add(i * 20);
            let qx = nibbles(xb.add(4));
            for ((a, m), &y) in acc.iter_mut().zip(&mut mins).zip(&yp) {
                let yb = y.add(i * 36);
                let d = _mm256_set1_ps(d_product(xb, yb));
                *m += d_product(xb.add(2), yb.add(2));
                let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
                *a = _mm256_fmadd_ps(d, dot_u8_i8(qx, qy), *a);
            }
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    std::array::from_fn(|r| unsafe { hsum(acc[r]) } + mins[r])
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0_x4(x: &[u8], y: [&[u8]; 4]) -> [f32; 4] {
    let n = x.len() / 34;
    debug_assert!(y.iter().all(|r| r.len() == n * 34));
    let (xp, yp) = (x.as_ptr(), y.map(<[u8]>::as_ptr));
    let mut acc = [_mm256_setzero_ps(); 4];
    for i in 0..n {
        // SAFETY: block i of every row is in bounds (file contract).
        unsafe {
            let xb = xp.add(i * 34);
            let qx = _mm256_loadu_si256(xb.add(2) as *const __m256i);
            for (a, &y) in acc.iter_mut().zip(&yp) {
                let yb = y.add(i * 34);
                let d = _mm256_set1_ps(d_product(xb, yb));
                let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
                *a = _mm256_fmadd_ps(d, dot_i8_i8(qx, qy), *a);
            }
        }
    }
    // SAFETY: AVX2 is enabled in this function.
    acc.map(|a| unsafe { hsum(a) })
}
