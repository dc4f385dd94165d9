//! The f64-lane kernels (cross-entropy's softmax sums, SiLU's and SwiGLU's gradients) with
//! AVX2 + FMA: 4 f64 lanes a register, `exp4_f64_avx2` (the AVX-512 `exp8_f64`'s bits). The
//! element-wise results equal the AVX-512 ones bit for bit; `sum_exp` sums in another order.

use std::arch::x86_64::*;

use super::{exp4_f64_avx2, silu_back_one, swiglu_back_one};

/// The two f64 halves of 8 f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn halves(x: __m256) -> [__m256d; 2] {
    [
        _mm256_cvtps_pd(_mm256_castps256_ps128(x)),
        _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)),
    ]
}

/// 8 f32 lanes from two f64 halves.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn join(h: [__m256d; 2]) -> __m256 {
    _mm256_set_m128(_mm256_cvtpd_ps(h[1]), _mm256_cvtpd_ps(h[0]))
}

/// [`super::sum_exp_f64`].
///
/// # Safety
/// AVX2 + FMA present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn sum_exp(row: &[f32], max: f32) -> f64 {
    let m = _mm256_set1_ps(max);
    let mut acc = [_mm256_setzero_pd(); 2];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        // SAFETY: 8 f32s; AVX2 + FMA (caller).
        unsafe {
            let h = halves(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), m));
            acc[0] = _mm256_add_pd(acc[0], exp4_f64_avx2(h[0]));
            acc[1] = _mm256_add_pd(acc[1], exp4_f64_avx2(h[1]));
        }
    }
    let mut lanes = [0f64; 4];
    // SAFETY: 4 f64s.
    unsafe { _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(acc[0], acc[1])) };
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&x| f64::from(x - max).exp())
        .sum();
    (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]) + tail
}

/// Whole 8-value chunks of [`super::softmax_scaled_row`]; returns how many it did.
///
/// # Safety
/// AVX2 + FMA present.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn softmax_scaled(
    row: &[f32],
    max: f32,
    sum: f64,
    k: f64,
    out: &mut [f32],
) -> usize {
    let (m, s, kk) = (_mm256_set1_ps(max), _mm256_set1_pd(sum), _mm256_set1_pd(k));
    let n = row.len().min(out.len()) / 8 * 8;
    for i in (0..n).step_by(8) {
        // SAFETY: i + 8 ≤ n values of row and out; AVX2 + FMA (caller).
        unsafe {
            let h = halves(_mm256_sub_ps(_mm256_loadu_ps(row.as_ptr().add(i)), m));
            let p = h.map(|x| _mm256_mul_pd(kk, _mm256_div_pd(exp4_f64_avx2(x), s)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), join(p));
        }
    }
    n
}

/// `s = 1/(1 + exp(−x))` of 4 f64 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn sigmoid(x: __m256d) -> __m256d {
    let one = _mm256_set1_pd(1.0);
    // SAFETY: AVX2 + FMA are enabled here.
    let e = unsafe { exp4_f64_avx2(_mm256_sub_pd(_mm256_setzero_pd(), x)) };
    _mm256_div_pd(one, _mm256_add_pd(one, e))
}

/// Whether any of 8 f32 lanes is below −100 (where the vector exp clamps).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn clamps(x: __m256) -> bool {
    _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-100.0))) != 0
}

/// Whole 8-value chunks of [`super::silu_back_row`]; returns how many it did.
///
/// # Safety
/// AVX2 + FMA present; pointers as [`super::silu_back_row`]'s.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn silu_back(x: *const f32, dy: *const f32, out: *mut f32, n: usize) -> usize {
    let one = _mm256_set1_pd(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 ≤ n values at each pointer (caller).
        unsafe {
            let x32 = _mm256_loadu_ps(x.add(i));
            if clamps(x32) {
                for j in i..i + 8 {
                    *out.add(j) = silu_back_one(*x.add(j), *dy.add(j));
                }
            } else {
                let (xv, gv) = (halves(x32), halves(_mm256_loadu_ps(dy.add(i))));
                let r = [0, 1].map(|h| {
                    let s = sigmoid(xv[h]);
                    let d = _mm256_mul_pd(s, _mm256_fmadd_pd(xv[h], _mm256_sub_pd(one, s), one));
                    _mm256_mul_pd(gv[h], d)
                });
                _mm256_storeu_ps(out.add(i), join(r));
            }
        }
        i += 8;
    }
    i
}

/// Whole 8-value chunks of [`super::swiglu_back_row`]; returns how many it did.
///
/// # Safety
/// AVX2 + FMA present; pointers as [`super::swiglu_back_row`]'s.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn swiglu_back(
    g: *const f32,
    u: *const f32,
    dy: *const f32,
    dg: *mut f32,
    du: *mut f32,
    n: usize,
) -> usize {
    let one = _mm256_set1_pd(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 ≤ n values at each pointer (caller).
        unsafe {
            let x32 = _mm256_loadu_ps(g.add(i));
            if clamps(x32) {
                for j in i..i + 8 {
                    let (a, b) = swiglu_back_one(*g.add(j), *u.add(j), *dy.add(j));
                    *dg.add(j) = a;
                    *du.add(j) = b;
                }
            } else {
                let d32 = _mm256_loadu_ps(dy.add(i));
                let t = halves(_mm256_mul_ps(d32, _mm256_loadu_ps(u.add(i))));
                let (x, dyd) = (halves(x32), halves(d32));
                let mut a = [_mm256_setzero_pd(); 2];
                let mut b = [_mm256_setzero_pd(); 2];
                for h in 0..2 {
                    let s = sigmoid(x[h]);
                    let d = _mm256_mul_pd(s, _mm256_fmadd_pd(x[h], _mm256_sub_pd(one, s), one));
                    a[h] = _mm256_mul_pd(t[h], d);
                    b[h] = _mm256_mul_pd(dyd[h], _mm256_mul_pd(x[h], s));
                }
                _mm256_storeu_ps(dg.add(i), join(a));
                _mm256_storeu_ps(du.add(i), join(b));
            }
        }
        i += 8;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::super::{
        silu_back_avx512, softmax_scaled_avx512, sum_exp_avx512, swiglu_back_avx512,
    };
    use crate::simd::{required_by_test, Isa};

    fn inputs(n: usize, seed: u32, spread: f32) -> Vec<f32> {
        (0..n as u32)
            .map(|i| {
                let x = i
                    .wrapping_mul(2_654_435_761)
                    .wrapping_add(seed.wrapping_mul(40_503));
                ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * spread
            })
            .collect()
    }

    /// Element by element the AVX2 kernels give the AVX-512 bits; the sum agrees to f64
    /// rounding. Rows include values below −100 (the scalar fallback) and ragged lengths.
    #[test]
    fn avx2_f64_lanes_match_avx512() {
        if !required_by_test("AVX2 f64 lanes", Isa::detected() >= Isa::Avx2) {
            return;
        }
        let both = required_by_test("AVX-512 f64 lanes", super::super::available());
        for (n, spread) in [(8, 4.0), (37, 30.0), (1000, 250.0), (4099, 12.0)] {
            let (x, u, dy) = (inputs(n, 1, spread), inputs(n, 2, 3.0), inputs(n, 3, 2.0));
            let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let (mut a1, mut a2, mut b1, mut b2) =
                (vec![0f32; n], vec![0f32; n], vec![0f32; n], vec![0f32; n]);
            let (mut s1, mut s2) = (vec![0f32; n], vec![0f32; n]);
            // SAFETY: AVX2 + FMA checked; n values each.
            let (d1, e1, f1, sum1) = unsafe {
                (
                    super::swiglu_back(
                        x.as_ptr(),
                        u.as_ptr(),
                        dy.as_ptr(),
                        a1.as_mut_ptr(),
                        b1.as_mut_ptr(),
                        n,
                    ),
                    super::silu_back(x.as_ptr(), dy.as_ptr(), s1.as_mut_ptr(), n),
                    super::softmax_scaled(&x, max, 3.5, 0.5, &mut s2),
                    super::sum_exp(&x, max),
                )
            };
            let want_sum: f64 = x.iter().map(|&v| f64::from(v - max).exp()).sum();
            assert!(
                (sum1 - want_sum).abs() <= 1e-13 * want_sum,
                "n {n}: {sum1} vs {want_sum}"
            );
            assert_eq!((d1, e1, f1), (n / 8 * 8, n / 8 * 8, n / 8 * 8));
            if !both {
                continue;
            }
            let mut t = vec![0f32; n];
            let mut soft = vec![0f32; n];
            // SAFETY: AVX-512F checked; n values each.
            let (d2, e2, f2, sum2) = unsafe {
                (
                    swiglu_back_avx512(
                        x.as_ptr(),
                        u.as_ptr(),
                        dy.as_ptr(),
                        a2.as_mut_ptr(),
                        b2.as_mut_ptr(),
                        n,
                    ),
                    silu_back_avx512(x.as_ptr(), dy.as_ptr(), t.as_mut_ptr(), n),
                    softmax_scaled_avx512(&x, max, 3.5, 0.5, &mut soft),
                    sum_exp_avx512(&x, max),
                )
            };
            let bits = |v: &[f32], k: usize| v[..k].iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let k = d1.min(d2);
            assert_eq!(bits(&a1, k), bits(&a2, k), "n {n}: swiglu dg");
            assert_eq!(bits(&b1, k), bits(&b2, k), "n {n}: swiglu du");
            let k = e1.min(e2);
            assert_eq!(bits(&s1, k), bits(&t, k), "n {n}: silu");
            let k = f1.min(f2);
            assert_eq!(bits(&s2, k), bits(&soft, k), "n {n}: softmax");
            assert!((sum1 - sum2).abs() <= 1e-13 * sum2, "n {n}: sums");
        }
    }
}
