//! The horizontal sum of 16 f32 lanes in one fixed order, alone and for 16 vectors at once.
//!
//! The order is a halving tree: lanes `i + 8`, then `i + 4`, then `i + 2`, then `i + 1` are
//! added to lane `i`. [`hsum`] spells it out (rather than leaving it to the compiler's
//! reduction) so that [`hsum_x16`], which sums 16 vectors with 15 vector additions per level
//! pair instead of a reduction each, adds the same pairs and gives the same bits: attention
//! scores reduced 16 rows at a time equal the F16 dot kernel's, one row at a time.

use std::arch::x86_64::*;

/// The sum of the 16 lanes: `((v[i] + v[i+8]) + (… + v[i+12])) …`, a halving tree.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn hsum(v: __m512) -> f32 {
    let h8 = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    );
    let h4 = _mm_add_ps(_mm256_castps256_ps128(h8), _mm256_extractf128_ps::<1>(h8));
    let h2 = _mm_add_ps(h4, _mm_movehl_ps(h4, h4));
    _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)))
}

/// `[hsum(v[0]), …, hsum(v[15])]` bit for bit, as one vector.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) fn hsum_x16(v: &[__m512; 16]) -> __m512 {
    // Level 1 (lane i + lane i+8): vector p holds v[2p]'s 8 partial sums, then v[2p+1]'s.
    let mut l1 = [_mm512_setzero_ps(); 8];
    for (p, o) in l1.iter_mut().enumerate() {
        let (a, b) = (v[2 * p], v[2 * p + 1]);
        *o = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
        );
    }
    // Level 2 (i + i+4): 128-bit lane m of vector p holds v[4p + m]'s 4 partial sums.
    let mut l2 = [_mm512_setzero_ps(); 4];
    for (p, o) in l2.iter_mut().enumerate() {
        let (a, b) = (l1[2 * p], l1[2 * p + 1]);
        *o = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(a, b),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(a, b),
        );
    }
    // Level 3 (i + i+2): 128-bit lane m of vector p holds v[m]'s 2 partials and v[4 + m]'s
    // (p = 0), or v[8 + m]'s and v[12 + m]'s (p = 1).
    let mut l3 = [_mm512_setzero_ps(); 2];
    for (p, o) in l3.iter_mut().enumerate() {
        let (a, b) = (_mm512_castps_pd(l2[2 * p]), _mm512_castps_pd(l2[2 * p + 1]));
        *o = _mm512_add_ps(
            _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
            _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
        );
    }
    // Level 4 (i + i+1): lane 4m + c holds the sum of v[4c + m].
    let sums = _mm512_add_ps(
        _mm512_shuffle_ps::<0b10_00_10_00>(l3[0], l3[1]),
        _mm512_shuffle_ps::<0b11_01_11_01>(l3[0], l3[1]),
    );
    // Lane n takes lane 4·(n mod 4) + n / 4.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_permutexvar_ps(order, sums)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 16-at-once sum equals 16 single sums bit for bit (values spread over magnitudes so
    /// that the order of the additions shows), and the single sum is the halving tree.
    #[test]
    fn x16_equals_single_sums_bit_for_bit() {
        if !crate::simd::required_by_test(
            "AVX-512 F",
            std::arch::is_x86_feature_detected!("avx512f"),
        ) {
            return;
        }
        let mut rng = tinynn_core::rng::Rng::new(0x2545_F491_4F6C_DD1D);
        let mut next = || {
            // Values of very different magnitudes, so the order of the sums matters.
            rng.range_f32(-0.5, 0.5) * [1.0, 1e-4, 1e4, 3.0][rng.below(4) as usize]
        };
        for _ in 0..500 {
            let rows: Vec<[f32; 16]> = (0..16).map(|_| std::array::from_fn(|_| next())).collect();
            // SAFETY: AVX-512F checked above; each row is 16 floats.
            unsafe {
                let v: [__m512; 16] = std::array::from_fn(|i| _mm512_loadu_ps(rows[i].as_ptr()));
                let mut got = [0f32; 16];
                _mm512_storeu_ps(got.as_mut_ptr(), hsum_x16(&v));
                for (i, r) in rows.iter().enumerate() {
                    let want = hsum(v[i]);
                    assert_eq!(got[i].to_bits(), want.to_bits(), "row {i}");
                    let mut t = *r;
                    for half in [8, 4, 2, 1] {
                        for l in 0..half {
                            t[l] += t[l + half];
                        }
                    }
                    assert_eq!(want.to_bits(), t[0].to_bits(), "tree of row {i}");
                }
            }
        }
    }
}
