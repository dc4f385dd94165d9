//! The f16 accumulator arithmetic of ggml's CPU flash attention (`ggml_vec_mad_f16`,
//! `ggml_vec_scale_f16`): an accumulator held as f16 values (stored here as f32 that are exactly
//! representable in f16), updated and rounded back to f16 at every step.
//!
//! Safety contract of this file: the `#[target_feature]` functions are called only after
//! `Isa::detected()` reported AVX2 (which includes F16C and FMA); slices are bounds-checked by
//! the safe wrappers.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use tinynn_core::quant::half;

use super::Isa;

#[inline]
fn round16(x: f32) -> f32 {
    half::f16_to_f32(half::f32_to_f16(x))
}

/// `acc[i] = f16(acc[i] + f16 v[i] · s)` for every i (`v` holds `acc.len()` little-endian f16s).
pub fn mad_f16_rounded(acc: &mut [f32], v: &[u8], s: f32) {
    assert!(v.len() >= 2 * acc.len(), "v holds fewer values than acc");
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx512F {
        // SAFETY: AVX-512F/F16C/FMA are present (checked above); lengths checked above. The
        // same per-element arithmetic as the AVX2 loop (one FMA, then rounded to f16).
        let done = unsafe { mad_avx512(acc, v, s) };
        // SAFETY: as below, for the rest.
        unsafe { mad_avx2(&mut acc[done..], &v[2 * done..], s) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        // SAFETY: AVX2/F16C/FMA are present (checked above); lengths checked above.
        unsafe { mad_avx2(acc, v, s) };
        return;
    }
    for (a, b) in acc.iter_mut().zip(v.chunks_exact(2)) {
        *a = round16(*a + half::f16_to_f32(u16::from_le_bytes([b[0], b[1]])) * s);
    }
}

/// `acc[i] = f16(acc[i] · s)` for every i.
pub fn scale_f16_rounded(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        // SAFETY: AVX2/F16C/FMA are present (checked above).
        unsafe { scale_avx2(acc, s) };
        return;
    }
    for a in acc.iter_mut() {
        *a = round16(*a * s);
    }
}

/// Whole 16-value chunks of [`mad_f16_rounded`]; returns how many values it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,f16c")]
unsafe fn mad_avx512(acc: &mut [f32], v: &[u8], s: f32) -> usize {
    let sv = _mm512_set1_ps(s);
    let mut i = 0;
    while i + 16 <= acc.len() {
        // SAFETY: 16 values at acc[i..] and 32 bytes at v[2i..] (lengths checked by the caller).
        unsafe {
            let vf = _mm512_cvtph_ps(_mm256_loadu_si256(v.as_ptr().add(2 * i) as *const __m256i));
            let a = _mm512_loadu_ps(acc.as_ptr().add(i));
            let r = _mm512_fmadd_ps(vf, sv, a);
            let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            _mm512_storeu_ps(acc.as_mut_ptr().add(i), r);
        }
        i += 16;
    }
    i
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_avx2(acc: &mut [f32], v: &[u8], s: f32) {
    let n = acc.len();
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n values of acc, and 16 bytes of v at 2i (v.len() >= 2n).
        unsafe {
            let vf = _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().add(2 * i) as *const __m128i));
            let a = _mm256_loadu_ps(acc.as_ptr().add(i));
            let r = _mm256_fmadd_ps(vf, sv, a);
            let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), r);
        }
        i += 8;
    }
    for j in i..n {
        let b = [v[2 * j], v[2 * j + 1]];
        acc[j] = round16(acc[j] + half::f16_to_f32(u16::from_le_bytes(b)) * s);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_avx2(acc: &mut [f32], s: f32) {
    let n = acc.len();
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe {
            let a = _mm256_mul_ps(_mm256_loadu_ps(acc.as_ptr().add(i)), sv);
            let r = _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a));
            _mm256_storeu_ps(acc.as_mut_ptr().add(i), r);
        }
        i += 8;
    }
    for a in acc[i..].iter_mut() {
        *a = round16(*a * s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_matches_scalar_rounding() {
        let n = 67;
        let v: Vec<u8> = (0..n)
            .flat_map(|i| half::f32_to_f16((i as f32 * 0.37).sin() * 3.0).to_le_bytes())
            .collect();
        let mut a: Vec<f32> = (0..n).map(|i| round16((i as f32 * 0.11).cos())).collect();
        let mut b = a.clone();
        mad_f16_rounded(&mut a, &v, 0.731);
        scale_f16_rounded(&mut a, 0.9);
        for (j, x) in b.iter_mut().enumerate() {
            let vj = half::f16_to_f32(u16::from_le_bytes([v[2 * j], v[2 * j + 1]]));
            *x = round16(round16(*x + vj * 0.731) * 0.9);
        }
        // FMA rounds once where the scalar path rounds twice; results agree to one f16 ulp.
        for (x, y) in a.iter().zip(&b) {
            assert!((x - y).abs() <= y.abs() * 1e-3 + 1e-7, "{x} vs {y}");
        }
    }
}
