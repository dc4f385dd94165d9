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
