//! The AVX2 + FMA register tile of the f32 GEMM (CPUs without AVX-512).
//!
//! It reads the same packed panel as the AVX-512 tile (32 lanes of `i` per reduction step) as
//! two halves of 16 lanes, and each half for up to [`MR_AVX2`] values of `m` at once: 12
//! accumulators (2 ymm × 6), two panel loads and a broadcast fit in the 16 ymm registers, and
//! 12 independent fused multiply-adds per step keep both FMA pipes busy through their latency
//! (blocks of 4 values of `m`, 8 accumulators, did not: `mul_mat_t` at SmolLM2's up
//! projection × 1024 tokens, one thread, 22.0–23.5 → 20.7–21.5 ms). Every output element is
//! still one f32 accumulator fed by fused multiply-adds over `r` in order, so both tiles give
//! the same bits.

use std::arch::x86_64::*;

use super::{Tile, NR};

/// Lanes of `i` per half panel.
const HALF: usize = NR / 2;

/// Values of `m` per AVX2 tile (the AVX-512 tile takes `MR`).
pub(super) const MR_AVX2: usize = 6;

/// 8 lanes' mask for `_mm256_maskload_ps` / `_mm256_maskstore_ps`: the first `valid` set.
///
/// # Safety
/// AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn first_lanes(valid: usize) -> __m256i {
    let iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_cmpgt_epi32(_mm256_set1_epi32(valid.min(8) as i32), iota)
}

impl Tile {
    /// [`Tile::run`] on AVX2, for `M ≤ MR_AVX2`.
    ///
    /// # Safety
    /// AVX2 + FMA; `kc` panel rows, `B(m, r)` for `m < M`, `r < kc`, and C rows `m < M` (the
    /// valid lanes) exist.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn run_avx2<const M: usize>(&self) {
        const { assert!(M <= MR_AVX2) };
        // The valid lanes are a prefix of the tile.
        let lanes = self.mask.count_ones() as usize;
        for h in 0..2 {
            let valid = lanes.saturating_sub(HALF * h).min(HALF);
            if valid == 0 {
                break;
            }
            // SAFETY: columns 0..M of the tile, lanes of half h (caller).
            unsafe { self.half::<M>(h, valid) };
        }
    }

    /// Lanes `16h..16h + valid` of `C(q, ·)` for `q < Q`.
    ///
    /// # Safety
    /// As [`Tile::run_avx2`], for those columns and lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn half<const Q: usize>(&self, h: usize, valid: usize) {
        let (k0, k1) = (first_lanes(valid), first_lanes(valid.saturating_sub(8)));
        // A whole half takes plain loads and stores (`store_first_lanes8` says why).
        let whole = valid == HALF;
        let mut acc = [[_mm256_setzero_ps(); 2]; Q];
        if !self.first {
            for (q, a) in acc.iter_mut().enumerate() {
                // SAFETY: C row q, the valid lanes of half h.
                unsafe {
                    let c = self.c.add(q * self.cm + HALF * h);
                    if whole {
                        a[0] = _mm256_loadu_ps(c);
                        a[1] = _mm256_loadu_ps(c.add(8));
                    } else {
                        a[0] = _mm256_maskload_ps(c, k0);
                        a[1] = _mm256_maskload_ps(c.add(8), k1);
                    }
                }
            }
        }
        // SAFETY: the panel holds kc rows of NR lanes; B(q, r) exist for q < Q, r < kc.
        unsafe {
            let panel = self.panel.add(HALF * h);
            let b = self.b;
            for r in 0..self.kc {
                let a0 = _mm256_loadu_ps(panel.add(r * NR));
                let a1 = _mm256_loadu_ps(panel.add(r * NR + 8));
                let br = b.add(r * self.br);
                for (q, a) in acc.iter_mut().enumerate() {
                    let bv = _mm256_broadcast_ss(&*br.add(q * self.bm));
                    a[0] = _mm256_fmadd_ps(a0, bv, a[0]);
                    a[1] = _mm256_fmadd_ps(a1, bv, a[1]);
                }
            }
        }
        for (q, a) in acc.iter().enumerate() {
            // SAFETY: C row q, the valid lanes of half h.
            unsafe {
                let c = self.c.add(q * self.cm + HALF * h);
                crate::simd::store_first_lanes8(c, valid, a[0]);
                crate::simd::store_first_lanes8(c.add(8), valid.saturating_sub(8), a[1]);
            }
        }
    }
}
