//! `exp` of f32 values computed in f64 and rounded once, so each result is the correctly rounded
//! exp except when the exact value lies within about 1e-13 (relative) of a rounding boundary
//! (the C library's `expf`, and so `f32::exp`, misses it by one unit in the last place for
//! about 1 input in 2,000). One algorithm — clamp, `n = round(x·log2 e)`, `r = x − n·ln2` in two
//! fused steps, a degree-11 Taylor polynomial by fused Horner steps, times `2^n` — written three
//! times with the same IEEE operations in the same order: 16 lanes with AVX-512 (`exp16`),
//! 8 lanes with AVX2 + FMA (`exp8_avx2`), one value in scalar code ([`exp_f32`]). So every
//! instruction set, and every row's tail, gives the same bits.

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
    for c in TAYLOR {
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

/// The scalar twin of `exp8_f64`, operation for operation (fused steps by `mul_add`).
fn exp_f64_scalar(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let xc = x.clamp(-120.0, 100.0);
    let n = (xc * std::f64::consts::LOG2_E).round_ties_even();
    let r = (-n).mul_add(LN2_HI, xc);
    let r = (-n).mul_add(LN2_LO, r);
    let mut p: f64 = 1.0 / 39_916_800.0;
    for c in TAYLOR {
        p = p.mul_add(r, c);
    }
    // n is in [−174, 145]: 2^n is a normal f64 and the product is exact.
    p * f64::from_bits(((n as i64 + 1023) as u64) << 52)
}

/// `exp(x)` rounded once to f32: the value every vector lane of this module gives for `x`.
pub fn exp_f32(x: f32) -> f32 {
    exp_f64_scalar(f64::from(x)) as f32
}

/// The Taylor coefficients after the leading 1/11!, highest degree first.
const TAYLOR: [f64; 11] = [
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
];

/// The AVX2 twin of `exp8_f64` for 4 lanes (`2^n` built in the exponent bits instead of
/// `scalef`; both are exact here).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp4_f64_avx2(x: __m256d) -> __m256d {
    let xc = _mm256_min_pd(
        _mm256_max_pd(x, _mm256_set1_pd(-120.0)),
        _mm256_set1_pd(100.0),
    );
    let n = _mm256_round_pd::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_pd(
        xc,
        _mm256_set1_pd(std::f64::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_HI), xc);
    let r = _mm256_fnmadd_pd(n, _mm256_set1_pd(LN2_LO), r);
    let mut p = _mm256_set1_pd(1.0 / 39_916_800.0);
    for c in TAYLOR {
        p = _mm256_fmadd_pd(p, r, _mm256_set1_pd(c));
    }
    // 2^n: (n + 1023) in the exponent field; n is integral in [−174, 145].
    let bits = _mm256_slli_epi64::<52>(_mm256_add_epi64(
        _mm256_cvtepi32_epi64(_mm256_cvtpd_epi32(n)),
        _mm256_set1_epi64x(1023),
    ));
    let y = _mm256_mul_pd(p, _mm256_castsi256_pd(bits));
    // NaN stays NaN (min/max above replaced it).
    _mm256_blendv_pd(y, x, _mm256_cmp_pd::<_CMP_UNORD_Q>(x, x))
}

/// `exp` of 8 f32 lanes with AVX2 + FMA, equal bit for bit to [`exp16`]'s lanes.
///
/// # Safety
/// AVX2 and FMA present.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp8_avx2(x: __m256) -> __m256 {
    let lo = exp4_f64_avx2(_mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    let hi = exp4_f64_avx2(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(x)));
    _mm256_set_m128(_mm256_cvtpd_ps(hi), _mm256_cvtpd_ps(lo))
}

/// Whether [`exp16`] can run here.
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx512F
}

/// Whether `exp8_avx2` can run here (and the row kernels take their AVX2 paths).
fn avx2_available() -> bool {
    super::Isa::detected() >= super::Isa::Avx2
}

/// The widest lane count the row kernels use here: 16, 8, or 1 (scalar).
fn lanes() -> usize {
    if available() {
        16
    } else if avx2_available() {
        8
    } else {
        1
    }
}

/// [`exp_f32`] over a slice, 16 or 8 lanes at a time where the CPU allows (the same bits
/// either way).
pub fn exp_slice(xs: &mut [f32]) {
    let ptr = xs.as_mut_ptr();
    for_lanes(xs.len(), |i, w| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `for_lanes` hands out i + w ≤ len; w = 16 needs AVX-512F, w = 8 AVX2 + FMA,
        // which it checked.
        unsafe {
            match w {
                16 => _mm512_storeu_ps(ptr.add(i), exp16(_mm512_loadu_ps(ptr.add(i)))),
                8 => _mm256_storeu_ps(ptr.add(i), exp8_avx2(_mm256_loadu_ps(ptr.add(i)))),
                _ => *ptr.add(i) = exp_f32(*ptr.add(i)),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: i < len.
        unsafe {
            *ptr.add(i) = exp_f32(*ptr.add(i))
        }
    });
}

/// Calls `f(i, w)` over `0..n` in steps of the widest lane count `w` this CPU runs
/// ([`lanes`]), then `f(i, 1)` for the tail.
fn for_lanes(n: usize, mut f: impl FnMut(usize, usize)) {
    let w = lanes();
    let mut i = 0;
    while i + w <= n {
        f(i, w);
        i += w;
    }
    while i < n {
        f(i, 1);
        i += 1;
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
    #[cfg(target_arch = "x86_64")]
    if super::Isa::detected() >= super::Isa::Avx2 {
        // SAFETY: AVX2 + FMA checked.
        return unsafe { f64_lanes_avx2::sum_exp(row, max) };
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
    } else if super::Isa::detected() >= super::Isa::Avx2 {
        // SAFETY: AVX2 + FMA checked.
        done = unsafe { f64_lanes_avx2::softmax_scaled(row, max, sum, k, out) };
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
    } else if super::Isa::detected() >= super::Isa::Avx2 {
        // SAFETY: AVX2 + FMA checked; pointers from the caller.
        i = unsafe { f64_lanes_avx2::silu_back(x, dy, out, n) };
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
    } else if super::Isa::detected() >= super::Isa::Avx2 && !strict {
        // SAFETY: AVX2 + FMA checked; pointers from the caller.
        i = unsafe { f64_lanes_avx2::swiglu_back(g, u, dy, dg, du, n) };
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

/// SwiGLU for one value: `silu(g)·u = g / (1 + exp(−g)) · u`, with [`exp_f32`].
pub fn swiglu_one(g: f32, u: f32) -> f32 {
    g / (1.0 + exp_f32(-g)) * u
}

/// `out[i] = silu(g[i]) · u[i]` (SwiGLU) over `n` values; `out` may be `g` or `u`. Each value
/// is [`swiglu_one`]'s, 16 or 8 at a time where the CPU allows.
///
/// # Safety
/// `g`, `u` and `out` point to `n` f32s.
pub(crate) unsafe fn swiglu_row(g: *const f32, u: *const f32, out: *mut f32, n: usize) {
    for_lanes(n, |i, w| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: i + w ≤ n values at each pointer; w = 16 needs AVX-512F, w = 8 AVX2 + FMA
        // (checked by `for_lanes`).
        unsafe {
            match w {
                16 => swiglu16(g.add(i), u.add(i), out.add(i)),
                8 => swiglu8(g.add(i), u.add(i), out.add(i)),
                _ => *out.add(i) = swiglu_one(*g.add(i), *u.add(i)),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: i < n.
        unsafe {
            *out.add(i) = swiglu_one(*g.add(i), *u.add(i))
        }
    });
}

/// `swiglu_row` for slices (tests of the vector paths against [`swiglu_one`]).
pub fn swiglu_slices(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len();
    assert!(u.len() == n && out.len() == n);
    // SAFETY: three slices of n values.
    unsafe { swiglu_row(g.as_ptr(), u.as_ptr(), out.as_mut_ptr(), n) };
}

/// 16 values of [`swiglu_row`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn swiglu16(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: 16 values at each pointer (caller).
    unsafe {
        let x = _mm512_loadu_ps(g);
        let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        let s = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e));
        _mm512_storeu_ps(out, _mm512_mul_ps(s, _mm512_loadu_ps(u)));
    }
}

/// 8 values of [`swiglu_row`] with AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu8(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: 8 values at each pointer (caller).
    unsafe {
        let x = _mm256_loadu_ps(g);
        let e = exp8_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x));
        let s = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
        _mm256_storeu_ps(out, _mm256_mul_ps(s, _mm256_loadu_ps(u)));
    }
}

/// The scalar formula of the GeGLU row kernel for one value: `gelu_tanh(g)·u`, GELU's tanh form
/// written as `g / (1 + exp(−2·c·(g + 0.044715·g³)))`, `c = sqrt(2/π)` (the same function as
/// `0.5·g·(1 + tanh(c·(g + 0.044715·g³)))`), with [`exp_f32`].
pub fn geglu_one(g: f32, u: f32) -> f32 {
    const C2: f32 = -2.0 * 0.797_884_6;
    // −z = −2c·g·(1 + a·g²), in the vector kernels' order of operations.
    let nz = C2 * g * (1.0 + 0.044715 * g * g);
    g / (1.0 + exp_f32(nz)) * u
}

/// `out[i] = gelu_tanh(g[i])·u[i]` for `n` values: each [`geglu_one`]'s, 16 or 8 at a time
/// where the CPU allows.
///
/// # Safety
/// `g`, `u`, `out` point to `n` f32s; `out` may equal `g` or `u`.
pub(crate) unsafe fn geglu_row(g: *const f32, u: *const f32, out: *mut f32, n: usize) {
    for_lanes(n, |i, w| {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: i + w ≤ n values at each pointer; w = 16 needs AVX-512F, w = 8 AVX2 + FMA
        // (checked by `for_lanes`).
        unsafe {
            match w {
                16 => geglu16(g.add(i), u.add(i), out.add(i)),
                8 => geglu8(g.add(i), u.add(i), out.add(i)),
                _ => *out.add(i) = geglu_one(*g.add(i), *u.add(i)),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        // SAFETY: i < n.
        unsafe {
            *out.add(i) = geglu_one(*g.add(i), *u.add(i))
        }
    });
}

/// `geglu_row` for slices (tests of the vector paths against [`geglu_one`]).
pub fn geglu_slices(g: &[f32], u: &[f32], out: &mut [f32]) {
    let n = g.len();
    assert!(u.len() == n && out.len() == n);
    // SAFETY: three slices of n values.
    unsafe { geglu_row(g.as_ptr(), u.as_ptr(), out.as_mut_ptr(), n) };
}

/// 16 values of [`geglu_row`].
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn geglu16(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: 16 values at each pointer (caller).
    unsafe {
        let one = _mm512_set1_ps(1.0);
        let x = _mm512_loadu_ps(g);
        let inner = _mm512_add_ps(
            one,
            _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715), x), x),
        );
        let nz = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(-2.0 * 0.797_884_6), x), inner);
        let s = _mm512_div_ps(x, _mm512_add_ps(one, exp16(nz)));
        _mm512_storeu_ps(out, _mm512_mul_ps(s, _mm512_loadu_ps(u)));
    }
}

/// 8 values of [`geglu_row`] with AVX2.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn geglu8(g: *const f32, u: *const f32, out: *mut f32) {
    // SAFETY: 8 values at each pointer (caller).
    unsafe {
        let one = _mm256_set1_ps(1.0);
        let x = _mm256_loadu_ps(g);
        let inner = _mm256_add_ps(
            one,
            _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715), x), x),
        );
        let nz = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(-2.0 * 0.797_884_6), x), inner);
        let s = _mm256_div_ps(x, _mm256_add_ps(one, exp8_avx2(nz)));
        _mm256_storeu_ps(out, _mm256_mul_ps(s, _mm256_loadu_ps(u)));
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::simd::{required_by_test, Isa};

    /// Inputs over the whole range, tails of the polynomial's interval, specials.
    fn inputs() -> Vec<f32> {
        let mut xs: Vec<f32> = (0..200_000)
            .map(|i| -130.0 + 240.0 * i as f32 / 200_000.0)
            .collect();
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        xs.extend((0..50_000).map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f32::from_bits(state as u32)
        }));
        xs.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            88.72283,
            88.72284,
            -87.33654,
            -103.97208,
            -120.0,
            100.0,
        ]);
        while !xs.len().is_multiple_of(16) {
            xs.push(0.5);
        }
        xs
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn exp_is_the_same_bits_on_every_instruction_set() {
        let xs = inputs();
        let want: Vec<f32> = xs.iter().map(|&x| exp_f32(x)).collect();
        if required_by_test("AVX2 + FMA", Isa::available().contains(&Isa::Avx2)) {
            for (c, w) in xs.chunks_exact(8).zip(want.chunks_exact(8)) {
                let mut got = [0f32; 8];
                // SAFETY: AVX2 + FMA present; 8 values.
                unsafe {
                    _mm256_storeu_ps(got.as_mut_ptr(), exp8_avx2(_mm256_loadu_ps(c.as_ptr())))
                };
                for ((&x, &g), &w) in c.iter().zip(&got).zip(w) {
                    assert!(same(g, w), "avx2 exp({x}) = {g}, scalar {w}");
                }
            }
        }
        if required_by_test("AVX-512 F", Isa::available().contains(&Isa::Avx512F)) {
            for (c, w) in xs.chunks_exact(16).zip(want.chunks_exact(16)) {
                let mut got = [0f32; 16];
                // SAFETY: AVX-512F present; 16 values.
                unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(c.as_ptr()))) };
                for ((&x, &g), &w) in c.iter().zip(&got).zip(w) {
                    assert!(same(g, w), "avx512 exp({x}) = {g}, scalar {w}");
                }
            }
        }
        // And the scalar one is exp: within an ulp of f64's exp rounded once (exact but for
        // the clamped ends, where both are 0 or +inf anyway).
        for (&x, &w) in xs.iter().zip(&want) {
            let exact = (f64::from(x)).exp() as f32;
            assert!(same(w, exact), "exp({x}) = {w}, f64 exp rounded {exact}");
        }
    }

    #[test]
    fn glu_rows_are_the_same_bits_on_every_instruction_set() {
        let g: Vec<f32> = inputs()
            .into_iter()
            .map(|x| {
                if x.is_finite() {
                    x.clamp(-40.0, 40.0)
                } else {
                    x
                }
            })
            .collect();
        let u: Vec<f32> = (0..g.len()).map(|i| (i % 97) as f32 / 13.0 - 3.0).collect();
        type Wide = unsafe fn(*const f32, *const f32, *mut f32);
        type Kernel = (&'static str, fn(f32, f32) -> f32, Wide, Wide);
        let kernels: [Kernel; 2] = [
            ("swiglu", swiglu_one, swiglu8, swiglu16),
            ("geglu", geglu_one, geglu8, geglu16),
        ];
        for (name, one, k8, k16) in kernels {
            let want: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| one(a, b)).collect();
            for (w, present) in [
                (8, Isa::available().contains(&Isa::Avx2)),
                (16, Isa::available().contains(&Isa::Avx512F)),
            ] {
                if !required_by_test(&format!("{name} with {w} lanes"), present) {
                    continue;
                }
                let mut got = vec![0f32; g.len()];
                for i in (0..g.len()).step_by(w) {
                    let k = if w == 8 { k8 } else { k16 };
                    // SAFETY: the instruction set is present; w values at each pointer.
                    unsafe { k(g[i..].as_ptr(), u[i..].as_ptr(), got[i..].as_mut_ptr()) };
                }
                for i in 0..g.len() {
                    assert!(
                        same(got[i], want[i]),
                        "{name}/{w}({}, {}) = {}, scalar {}",
                        g[i],
                        u[i],
                        got[i],
                        want[i]
                    );
                }
            }
            // The row entry point (whatever this run's lanes) with ragged tails.
            for n in [0, 1, 7, 8, 9, 15, 16, 17, 33, 1000] {
                let mut out = vec![0f32; n];
                if name == "swiglu" {
                    swiglu_slices(&g[..n], &u[..n], &mut out);
                } else {
                    geglu_slices(&g[..n], &u[..n], &mut out);
                }
                for i in 0..n {
                    assert!(same(out[i], want[i]), "{name} row of {n}, value {i}");
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod f64_lanes_avx2;
