//! `exp` for 16 f32 lanes at once, computed in f64 and rounded once, so each lane equals the
//! correctly rounded `expf` — what the C library's `expf` (and so `f32::exp`) returns — except
//! when the exact value lies within about 1e-13 (relative) of a rounding boundary. Kernels that
//! switch from scalar `exp` to this keep their results.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// `exp` of each lane of `x` (−∞ → 0, +∞ → +∞, NaN → NaN, overflow → +∞, underflow → 0 or a
/// subnormal).
///
/// # Safety
/// AVX-512F present.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn exp16(x: __m512) -> __m512 {
    let lo = exp8_f64(_mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    let hi = exp8_f64(_mm512_cvtps_pd(_mm256_castpd_ps(
        _mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)),
    )));
    let r = _mm512_castps256_ps512(_mm512_cvtpd_ps(lo));
    _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castps_pd(r),
        _mm256_castps_pd(_mm512_cvtpd_ps(hi)),
    ))
}

/// exp in f64 for inputs that came from f32 (|x| small enough that n·ln2 needs no split).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp8_f64(x: __m512d) -> __m512d {
    // Beyond these the f32 result is 0 or +∞ anyway; clamping keeps 2^n finite in f64.
    let xc = _mm512_min_pd(
        _mm512_max_pd(x, _mm512_set1_pd(-120.0)),
        _mm512_set1_pd(100.0),
    );
    let n = _mm512_roundscale_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_pd(xc, _mm512_set1_pd(std::f64::consts::LOG2_E)),
    );
    // r = x − n·ln2 with ln2 split in two so r is exact to ~1e-17.
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_HI), xc);
    let r = _mm512_fnmadd_pd(n, _mm512_set1_pd(LN2_LO), r);
    // exp(r), |r| ≤ 0.347: Taylor to degree 11 (truncation < 1e-15 relative), Horner.
    let mut p = _mm512_set1_pd(1.0 / 39_916_800.0);
    for c in [
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(c));
    }
    let y = _mm512_scalef_pd(p, n);
    // NaN stays NaN (min/max above replaced it).
    let nan = _mm512_cmp_pd_mask::<_CMP_UNORD_Q>(x, x);
    _mm512_mask_mov_pd(y, nan, x)
}

// ln 2 = LN2_HI + LN2_LO, LN2_HI with its low 32 bits zero (n · LN2_HI is exact).
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);

/// Whether [`exp16`] can run here.
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx512Vnni
}

/// `exp16` over a slice (tests; falls back to `f32::exp` without AVX-512).
pub fn exp_slice(xs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if available() {
        let mut chunks = xs.chunks_exact_mut(16);
        for c in &mut chunks {
            // SAFETY: AVX-512F checked; 16 f32s.
            unsafe { _mm512_storeu_ps(c.as_mut_ptr(), exp16(_mm512_loadu_ps(c.as_ptr()))) };
        }
        for x in chunks.into_remainder() {
            *x = x.exp();
        }
        return;
    }
    for x in xs {
        *x = x.exp();
    }
}

/// `Σ_j exp(row[j] − max)` with `row[j] − max` rounded to f32 and the exp and sum in f64
/// (softmax denominators of cross-entropy), eight f64 lanes at a time where AVX-512 is
/// available.
pub(crate) fn sum_exp_f64(row: &[f32], max: f32) -> f64 {
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F checked.
        return unsafe { sum_exp_avx512(row, max) };
    }
    row.iter().map(|&x| f64::from(x - max).exp()).sum()
}

/// `out[j] = (k · exp(row[j] − max) / sum) as f32`, the exp as in [`sum_exp_f64`].
pub(crate) fn softmax_scaled_row(row: &[f32], max: f32, sum: f64, k: f64, out: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F checked.
        done = unsafe { softmax_scaled_avx512(row, max, sum, k, out) };
    }
    for (o, &x) in out[done..].iter_mut().zip(&row[done..]) {
        *o = (k * (f64::from(x - max).exp() / sum)) as f32;
    }
}

/// The f64 exps of 16 f32 lanes `x − max`, as two 8-lane halves.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn exp_halves(x: __m512, max: __m512) -> (__m512d, __m512d) {
    let d = _mm512_sub_ps(x, max);
    let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(d));
    let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
        _mm512_castps_pd(d),
    )));
    // SAFETY: AVX-512F is enabled here.
    unsafe { (exp8_f64(lo), exp8_f64(hi)) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn sum_exp_avx512(row: &[f32], max: f32) -> f64 {
    let m = _mm512_set1_ps(max);
    let (mut a, mut b) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        // SAFETY: 16 f32s; AVX-512F is enabled here.
        let (lo, hi) = unsafe { exp_halves(_mm512_loadu_ps(c.as_ptr()), m) };
        a = _mm512_add_pd(a, lo);
        b = _mm512_add_pd(b, hi);
    }
    let tail: f64 = chunks
        .remainder()
        .iter()
        .map(|&x| f64::from(x - max).exp())
        .sum();
    _mm512_reduce_add_pd(_mm512_add_pd(a, b)) + tail
}

/// Whole 16-value chunks of [`softmax_scaled_row`]; returns how many values it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_scaled_avx512(row: &[f32], max: f32, sum: f64, k: f64, out: &mut [f32]) -> usize {
    let (m, s, kk) = (_mm512_set1_ps(max), _mm512_set1_pd(sum), _mm512_set1_pd(k));
    let n = row.len().min(out.len()) / 16 * 16;
    for i in (0..n).step_by(16) {
        // SAFETY: i + 16 ≤ n values of row and out; AVX-512F is enabled here.
        unsafe {
            let (lo, hi) = exp_halves(_mm512_loadu_ps(row.as_ptr().add(i)), m);
            let lo = _mm512_cvtpd_ps(_mm512_mul_pd(kk, _mm512_div_pd(lo, s)));
            let hi = _mm512_cvtpd_ps(_mm512_mul_pd(kk, _mm512_div_pd(hi, s)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), lo);
            _mm256_storeu_ps(out.as_mut_ptr().add(i + 8), hi);
        }
    }
    n
}

/// `out[i] = (dy[i] · silu'(x[i])) as f32` with `silu'(x) = s·(1 + x·(1 − s))`,
/// `s = 1/(1 + exp(−x))`, in f64 (SiLU's gradient); `out` may be `x` or `dy`.
///
/// # Safety
/// `x`, `dy` and `out` point to `n` f32s.
pub(crate) unsafe fn silu_back_row(x: *const f32, dy: *const f32, out: *mut f32, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F checked; pointers from the caller.
        i = unsafe { silu_back_avx512(x, dy, out, n) };
    }
    for j in i..n {
        // SAFETY: j < n.
        unsafe { *out.add(j) = silu_back_one(*x.add(j), *dy.add(j)) };
    }
}

fn silu_back_one(x: f32, dy: f32) -> f32 {
    let x = f64::from(x);
    let s = 1.0 / (1.0 + (-x).exp());
    (f64::from(dy) * (s * (1.0 + x * (1.0 - s)))) as f32
}

/// Whole 8-value chunks of [`silu_back_row`]; returns how many values it did. Chunks with an
/// `x` below −100 (where the vector exp clamps) go through the scalar formula.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn silu_back_avx512(x: *const f32, dy: *const f32, out: *mut f32, n: usize) -> usize {
    let one = _mm512_set1_pd(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 ≤ n values at each pointer; AVX-512F is enabled here.
        unsafe {
            let xv = _mm512_cvtps_pd(_mm256_loadu_ps(x.add(i)));
            let gv = _mm512_cvtps_pd(_mm256_loadu_ps(dy.add(i)));
            if _mm512_cmp_pd_mask::<_CMP_LT_OQ>(xv, _mm512_set1_pd(-100.0)) != 0 {
                for j in i..i + 8 {
                    *out.add(j) = silu_back_one(*x.add(j), *dy.add(j));
                }
            } else {
                let e = exp8_f64(_mm512_sub_pd(_mm512_setzero_pd(), xv));
                let s = _mm512_div_pd(one, _mm512_add_pd(one, e));
                let d = _mm512_mul_pd(s, _mm512_fmadd_pd(xv, _mm512_sub_pd(one, s), one));
                _mm256_storeu_ps(out.add(i), _mm512_cvtpd_ps(_mm512_mul_pd(gv, d)));
            }
        }
        i += 8;
    }
    i
}

/// SwiGLU's gradients over `n` values: `dg = (dy·u)·silu'(g)` and `du = dy·silu(g)`, the
/// sigmoid in f64 (the product `dy·u` in f32, as the separate ops rounded it). `strict`: the
/// scalar formula only.
///
/// # Safety
/// `g`, `u`, `dy`, `dg` and `du` point to `n` f32s; the outputs overlap no input.
pub(crate) unsafe fn swiglu_back_row(
    g: *const f32,
    u: *const f32,
    dy: *const f32,
    dg: *mut f32,
    du: *mut f32,
    n: usize,
    strict: bool,
) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if available() && !strict {
        // SAFETY: AVX-512F checked; pointers from the caller.
        i = unsafe { swiglu_back_avx512(g, u, dy, dg, du, n) };
    }
    for j in i..n {
        // SAFETY: j < n.
        unsafe {
            let (a, b) = swiglu_back_one(*g.add(j), *u.add(j), *dy.add(j));
            *dg.add(j) = a;
            *du.add(j) = b;
        }
    }
}

/// The scalar reference of `swiglu_back_row` for one value: `(dg, du)`.
pub fn swiglu_back_one(g: f32, u: f32, dy: f32) -> (f32, f32) {
    let x = f64::from(g);
    let s = 1.0 / (1.0 + (-x).exp());
    let t = f64::from(dy * u);
    (
        (t * (s * (1.0 + x * (1.0 - s)))) as f32,
        (f64::from(dy) * (x * s)) as f32,
    )
}

/// `swiglu_back_row` for slices (tests of the SIMD path against [`swiglu_back_one`]).
pub fn swiglu_back_slices(g: &[f32], u: &[f32], dy: &[f32], dg: &mut [f32], du: &mut [f32]) {
    let n = g.len();
    assert!(u.len() == n && dy.len() == n && dg.len() == n && du.len() == n);
    // SAFETY: five slices of n values; the outputs are distinct mutable slices.
    unsafe {
        swiglu_back_row(
            g.as_ptr(),
            u.as_ptr(),
            dy.as_ptr(),
            dg.as_mut_ptr(),
            du.as_mut_ptr(),
            n,
            false,
        )
    };
}

/// Whole 8-value chunks of [`swiglu_back_row`]; returns how many values it did. Chunks with a
/// `g` below −100 (where the vector exp clamps) go through the scalar formula.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn swiglu_back_avx512(
    g: *const f32,
    u: *const f32,
    dy: *const f32,
    dg: *mut f32,
    du: *mut f32,
    n: usize,
) -> usize {
    let one = _mm512_set1_pd(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 ≤ n values at each pointer; AVX-512F is enabled here.
        unsafe {
            let x32 = _mm256_loadu_ps(g.add(i));
            let x = _mm512_cvtps_pd(x32);
            if _mm512_cmp_pd_mask::<_CMP_LT_OQ>(x, _mm512_set1_pd(-100.0)) != 0 {
                for j in i..i + 8 {
                    let (a, b) = swiglu_back_one(*g.add(j), *u.add(j), *dy.add(j));
                    *dg.add(j) = a;
                    *du.add(j) = b;
                }
            } else {
                let d32 = _mm256_loadu_ps(dy.add(i));
                let t = _mm512_cvtps_pd(_mm256_mul_ps(d32, _mm256_loadu_ps(u.add(i))));
                let e = exp8_f64(_mm512_sub_pd(_mm512_setzero_pd(), x));
                let s = _mm512_div_pd(one, _mm512_add_pd(one, e));
                let d = _mm512_mul_pd(s, _mm512_fmadd_pd(x, _mm512_sub_pd(one, s), one));
                _mm256_storeu_ps(dg.add(i), _mm512_cvtpd_ps(_mm512_mul_pd(t, d)));
                let silu = _mm512_mul_pd(x, s);
                let dyd = _mm512_cvtps_pd(d32);
                _mm256_storeu_ps(du.add(i), _mm512_cvtpd_ps(_mm512_mul_pd(dyd, silu)));
            }
        }
        i += 8;
    }
    i
}

/// The largest value of `row` (NaNs ignored, −∞ for an empty row), in 16 independent lanes so
/// the compiler keeps it in vector max instructions instead of one dependent compare per value.
pub fn row_max(row: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |a, &v| if v > a { v } else { a });
    for c in chunks {
        for (a, &v) in m.iter_mut().zip(c) {
            if v > *a {
                *a = v;
            }
        }
    }
    m.iter().fold(tail, |a, &v| if v > a { v } else { a })
}

/// `out[i] = silu(g[i]) · u[i]` (SwiGLU) over `n` values; `out` may be `g` or `u`.
///
/// # Safety
/// `g`, `u` and `out` point to `n` f32s.
pub(crate) unsafe fn swiglu_row(g: *const f32, u: *const f32, out: *mut f32, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F checked; pointers from the caller.
        i = unsafe { swiglu_avx512(g, u, out, n) };
    }
    for j in i..n {
        // SAFETY: j < n.
        unsafe {
            let x = *g.add(j);
            *out.add(j) = x / (1.0 + (-x).exp()) * *u.add(j);
        }
    }
}

/// Whole 16-value chunks of [`swiglu_row`]; returns how many values it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn swiglu_avx512(g: *const f32, u: *const f32, out: *mut f32, n: usize) -> usize {
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 ≤ n values at each pointer.
        unsafe {
            let x = _mm512_loadu_ps(g.add(i));
            let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(out.add(i), _mm512_mul_ps(s, _mm512_loadu_ps(u.add(i))));
        }
        i += 16;
    }
    i
}

/// The scalar formula of the GeGLU row kernel for one value: `gelu_tanh(g)·u`, GELU's tanh form
/// written as `g / (1 + exp(−2·c·(g + 0.044715·g³)))`, `c = sqrt(2/π)` (the same function as
/// `0.5·g·(1 + tanh(c·(g + 0.044715·g³)))`).
pub fn geglu_one(g: f32, u: f32) -> f32 {
    const C2: f32 = 2.0 * 0.797_884_6;
    let z = C2 * g * (1.0 + 0.044715 * g * g);
    g / (1.0 + (-z).exp()) * u
}

/// `out[i] = gelu_tanh(g[i])·u[i]` for `n` values; 16 at a time with AVX-512 (each lane
/// [`geglu_one`]'s formula with a correctly rounded exp).
///
/// # Safety
/// `g`, `u`, `out` point to `n` f32s; `out` may equal `g` or `u`.
pub(crate) unsafe fn geglu_row(g: *const f32, u: *const f32, out: *mut f32, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if available() {
        // SAFETY: AVX-512F checked; pointers from the caller.
        i = unsafe { geglu_avx512(g, u, out, n) };
    }
    for j in i..n {
        // SAFETY: j < n.
        unsafe { *out.add(j) = geglu_one(*g.add(j), *u.add(j)) };
    }
}

/// `geglu_row` for slices (tests of the SIMD path against [`geglu_one`]).
pub fn geglu_slices(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len();
    assert!(u.len() == n && out.len() == n);
    // SAFETY: three slices of n values.
    unsafe { geglu_row(g.as_ptr(), u.as_ptr(), out.as_mut_ptr(), n) };
}

/// Whole 16-value chunks of [`geglu_row`]; returns how many values it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn geglu_avx512(g: *const f32, u: *const f32, out: *mut f32, n: usize) -> usize {
    let one = _mm512_set1_ps(1.0);
    let c2 = _mm512_set1_ps(-2.0 * 0.797_884_6);
    let a = _mm512_set1_ps(0.044715);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 ≤ n values at each pointer.
        unsafe {
            let x = _mm512_loadu_ps(g.add(i));
            // −z = −2c·x·(1 + a·x²), in the scalar formula's order of operations.
            let inner = _mm512_add_ps(one, _mm512_mul_ps(_mm512_mul_ps(a, x), x));
            let nz = _mm512_mul_ps(_mm512_mul_ps(c2, x), inner);
            let e = exp16(nz);
            let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
            _mm512_storeu_ps(out.add(i), _mm512_mul_ps(s, _mm512_loadu_ps(u.add(i))));
        }
        i += 16;
    }
    i
}
