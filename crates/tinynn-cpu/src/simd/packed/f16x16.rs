//! F16 × 16 rows. Group block (1024 B) of 32 elements: for each element `i` the 16 rows'
//! f16 weights side by side (32 B), so one `vcvtph2ps` gives 16 rows of one column.
//!
//! Activations are f32 values rounded to f16 (4 B each): the products and sums are those of
//! ggml's F16 dot (activations converted to f16, f16·f16 products accumulated in f32; the
//! product of two f16s is exact in f32), while the kernel reads each activation with the
//! FMA's own broadcast load instead of a convert per token and element.

/// Writes row `r`'s 32 f16 weights (64 B) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for i in 0..32 {
        dst[32 * i + 2 * r..][..2].copy_from_slice(&src[2 * i..][..2]);
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let mut acc = 0f32;
    for e in 0..nb * 32 {
        let xv = f32::from_le_bytes([x[4 * e], x[4 * e + 1], x[4 * e + 2], x[4 * e + 3]]);
        acc += super::f16_at(&w[32 * e + 2 * r..]) * xv;
    }
    acc
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx512::tile;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `T` tokens × 16 rows over `nb` blocks of 32 elements. Small tiles (decode) split the
    /// elements over several accumulators so the FMA latency does not bound them.
    ///
    /// # Safety
    /// AVX-512 F + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub(in super::super) unsafe fn tile<const T: usize>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let sets = match T {
            1 | 2 => 4,
            3 | 4 => 2,
            _ => 1,
        };
        let (x, xs) = (x as *const f32, x_stride / 4);
        let mut f = [[_mm512_setzero_ps(); T]; 4];
        let mut e = 0;
        while e < nb * 32 {
            if pf != 0 {
                // Streaming the group from memory: ask for this step's bytes (32·sets) `pf`
                // bytes ahead. SAFETY: prefetching never faults.
                let ahead = w.wrapping_add(32 * e + pf) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(ahead);
                if sets == 4 {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
                }
            }
            for (s, fs) in f.iter_mut().enumerate().take(sets) {
                // SAFETY: element e + s < nb·32 (sets divides 32) of the group and of every
                // token row is in bounds (caller).
                unsafe {
                    let wv =
                        _mm512_cvtph_ps(_mm256_loadu_si256(w.add(32 * (e + s)) as *const __m256i));
                    for (t, ft) in fs.iter_mut().enumerate() {
                        let xv = _mm512_set1_ps(x.add(t * xs + e + s).read_unaligned());
                        *ft = _mm512_fmadd_ps(wv, xv, *ft);
                    }
                }
            }
            e += sets;
        }
        let mask = super::super::lanes(valid);
        for t in 0..T {
            let mut sum = f[0][t];
            for fs in f.iter().take(sets).skip(1) {
                sum = _mm512_add_ps(sum, fs[t]);
            }
            // SAFETY: the `valid` columns of token t's output row are this thread's (caller).
            unsafe { _mm512_mask_storeu_ps(out.add(t * out_stride), mask, sum) };
        }
    }
}
