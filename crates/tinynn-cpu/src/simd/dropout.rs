//! Inverted dropout of a contiguous run of elements (`Op::Dropout`): the mask bits of each
//! element come from `tinynn_core::ops::dropout_bits` of its flat index, 8 at a time with
//! AVX-512 DQ's 64-bit multiplies, or one at a time in the reference.

use tinynn_core::ops::{dropout_bits, dropout_threshold, DROPOUT_INDEX_MUL, DROPOUT_SALT_MUL};

/// `out[j] = x[j] · keep` unless element `first + j` is dropped (then 0), `keep = 1/(1−p)`.
pub fn dropout_run(x: &[f32], out: &mut [f32], seed: u64, salt: u32, first: u64, p: f32) {
    assert_eq!(x.len(), out.len());
    #[cfg(target_arch = "x86_64")]
    if super::Isa::detected() >= super::Isa::Avx512F {
        // SAFETY: AVX-512 F, DQ and VL are present (the Avx512F level); the slices have equal
        // lengths.
        unsafe { dropout_avx512(x, out, seed, salt, first, p) };
        return;
    }
    dropout_run_ref(x, out, seed, salt, first, p);
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
unsafe fn dropout_avx512(x: &[f32], out: &mut [f32], seed: u64, salt: u32, first: u64, p: f32) {
    use std::arch::x86_64::*;
    let (keep, t) = (1.0 / (1.0 - p), dropout_threshold(p));
    let n = x.len();
    let base = seed.wrapping_add(u64::from(salt).wrapping_mul(DROPOUT_SALT_MUL));
    let lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    let (m1, m2) = (
        _mm512_set1_epi64(0xBF58_476D_1CE4_E5B9u64 as i64),
        _mm512_set1_epi64(0x94D0_49BB_1331_11EBu64 as i64),
    );
    let (imul, tv, kv) = (
        _mm512_set1_epi64(DROPOUT_INDEX_MUL as i64),
        _mm512_set1_epi64(t as i64),
        _mm256_set1_ps(keep),
    );
    let mut j = 0;
    while j + 8 <= n {
        let i = _mm512_add_epi64(
            _mm512_set1_epi64(first.wrapping_add(j as u64) as i64),
            lanes,
        );
        let mut z = _mm512_add_epi64(_mm512_set1_epi64(base as i64), _mm512_mullo_epi64(i, imul));
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
    dropout_run_ref(
        &x[j..],
        &mut out[j..],
        seed,
        salt,
        first.wrapping_add(j as u64),
        p,
    );
}
