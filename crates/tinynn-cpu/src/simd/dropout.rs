//! Inverted dropout of a contiguous run of elements (`Op::Dropout`): the mask bits of each
//! element come from `tinynn_core::ops::dropout_bits` of its flat index, 8 at a time with
//! AVX-512 DQ's 64-bit multiplies, 4 at a time with AVX2 (each 64-bit multiply made of three
//! 32-bit ones), or one at a time in the reference.

use tinynn_core::ops::{dropout_bits, dropout_threshold, DROPOUT_INDEX_MUL, DROPOUT_SALT_MUL};

/// `out[j] = x[j] · keep` unless element `first + j` is dropped (then 0), `keep = 1/(1−p)`.
pub fn dropout_run(x: &[f32], out: &mut [f32], seed: u64, salt: u32, first: u64, p: f32) {
    assert_eq!(x.len(), out.len());
    // Whole vectors with SIMD where present; the rest (or all) by the reference.
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if super::Isa::detected() >= super::Isa::Avx512F {
        // SAFETY: AVX-512 F, DQ and VL are present (the Avx512F level); the slices have equal
        // lengths.
        done = unsafe { dropout_avx512(x, out, &Run::new(seed, salt, first, p)) };
    } else if super::Isa::detected() >= super::Isa::Avx2 {
        // SAFETY: AVX2 is present (the Avx2 level); the slices have equal lengths.
        done = unsafe { dropout_avx2(x, out, &Run::new(seed, salt, first, p)) };
    }
    dropout_run_ref(
        &x[done..],
        &mut out[done..],
        seed,
        salt,
        first.wrapping_add(done as u64),
        p,
    );
}

/// What the SIMD runs need of a call: the hash's start `seed + salt·A`, the first element's
/// index, the drop threshold and the scale of the kept values.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Run {
    base: u64,
    first: u64,
    t: u64,
    keep: f32,
}

#[cfg(target_arch = "x86_64")]
impl Run {
    fn new(seed: u64, salt: u32, first: u64, p: f32) -> Run {
        Run {
            base: seed.wrapping_add(u64::from(salt).wrapping_mul(DROPOUT_SALT_MUL)),
            first,
            t: dropout_threshold(p),
            keep: 1.0 / (1.0 - p),
        }
    }
}

/// The scalar reference of [`dropout_run`].
pub fn dropout_run_ref(x: &[f32], out: &mut [f32], seed: u64, salt: u32, first: u64, p: f32) {
    let (keep, t) = (1.0 / (1.0 - p), dropout_threshold(p));
    for (j, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = if dropout_bits(seed, salt, first.wrapping_add(j as u64)) < t {
            0.0
        } else {
            v * keep
        };
    }
}

/// Whole 8-element runs of [`dropout_run`]; returns how many elements it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
unsafe fn dropout_avx512(x: &[f32], out: &mut [f32], run: &Run) -> usize {
    use std::arch::x86_64::*;
    let n = x.len();
    let lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    let (m1, m2) = (
        _mm512_set1_epi64(0xBF58_476D_1CE4_E5B9u64 as i64),
        _mm512_set1_epi64(0x94D0_49BB_1331_11EBu64 as i64),
    );
    let (imul, tv, kv) = (
        _mm512_set1_epi64(DROPOUT_INDEX_MUL as i64),
        _mm512_set1_epi64(run.t as i64),
        _mm256_set1_ps(run.keep),
    );
    let mut j = 0;
    while j + 8 <= n {
        let i = _mm512_add_epi64(
            _mm512_set1_epi64(run.first.wrapping_add(j as u64) as i64),
            lanes,
        );
        let mut z = _mm512_add_epi64(
            _mm512_set1_epi64(run.base as i64),
            _mm512_mullo_epi64(i, imul),
        );
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), m1);
        z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), m2);
        z = _mm512_srli_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 31)), 40);
        // Lanes whose bits reach the threshold are kept.
        let kept = _mm512_cmpge_epu64_mask(z, tv);
        // SAFETY: j + 8 <= n for both slices.
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(j)) };
        let r = _mm256_maskz_mul_ps(kept, v, kv);
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j), r) };
        j += 8;
    }
    j
}

/// The low 64 bits of `a · b` per 64-bit lane, from three 32 × 32 → 64-bit multiplies:
/// `lo(a)·lo(b) + (hi(a)·lo(b) + lo(a)·hi(b)) << 32` (the `hi·hi` term is past bit 63).
///
/// # Safety
/// AVX2 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mullo_epi64_avx2(
    a: std::arch::x86_64::__m256i,
    b: std::arch::x86_64::__m256i,
) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let lo = _mm256_mul_epu32(a, b);
    let cross = _mm256_add_epi64(
        _mm256_mul_epu32(_mm256_srli_epi64(a, 32), b),
        _mm256_mul_epu32(a, _mm256_srli_epi64(b, 32)),
    );
    _mm256_add_epi64(lo, _mm256_slli_epi64(cross, 32))
}

/// [`dropout_bits`] of the 4 indices `i` (lanes), as the reference computes them.
///
/// # Safety
/// AVX2 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn bits4_avx2(base: u64, i: std::arch::x86_64::__m256i) -> std::arch::x86_64::__m256i {
    use std::arch::x86_64::*;
    let (imul, m1, m2) = (
        _mm256_set1_epi64x(DROPOUT_INDEX_MUL as i64),
        _mm256_set1_epi64x(0xBF58_476D_1CE4_E5B9u64 as i64),
        _mm256_set1_epi64x(0x94D0_49BB_1331_11EBu64 as i64),
    );
    // SAFETY (all calls below): AVX2 is present (this function's contract).
    unsafe {
        let mut z = _mm256_add_epi64(_mm256_set1_epi64x(base as i64), mullo_epi64_avx2(i, imul));
        z = mullo_epi64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), m1);
        z = mullo_epi64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), m2);
        _mm256_srli_epi64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 31)), 40)
    }
}

/// Whole 8-element runs of [`dropout_run`] with AVX2; returns how many elements it did.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dropout_avx2(x: &[f32], out: &mut [f32], run: &Run) -> usize {
    use std::arch::x86_64::*;
    let n = x.len();
    let (tv, kv) = (_mm256_set1_epi64x(run.t as i64), _mm256_set1_ps(run.keep));
    // The bits are below 2^24 and so is the threshold (p < 1): a signed compare is exact.
    // Each 64-bit lane's mask, all ones or zeros, to 32-bit lanes 0..4 (even dwords first).
    let evens = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    let mut j = 0;
    while j + 8 <= n {
        let i0 = _mm256_add_epi64(
            _mm256_set1_epi64x(run.first.wrapping_add(j as u64) as i64),
            _mm256_setr_epi64x(0, 1, 2, 3),
        );
        let i1 = _mm256_add_epi64(i0, _mm256_set1_epi64x(4));
        // SAFETY: AVX2 is present (this function's target features).
        let (z0, z1) = unsafe { (bits4_avx2(run.base, i0), bits4_avx2(run.base, i1)) };
        let drop0 = _mm256_permutevar8x32_epi32(_mm256_cmpgt_epi64(tv, z0), evens);
        let drop1 = _mm256_permutevar8x32_epi32(_mm256_cmpgt_epi64(tv, z1), evens);
        let dropped = _mm256_castsi256_ps(_mm256_blend_epi32::<0xF0>(drop0, drop1));
        // SAFETY: j + 8 <= n for both slices.
        let v = unsafe { _mm256_loadu_ps(x.as_ptr().add(j)) };
        let r = _mm256_andnot_ps(dropped, _mm256_mul_ps(v, kv));
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(j), r) };
        j += 8;
    }
    j
}
