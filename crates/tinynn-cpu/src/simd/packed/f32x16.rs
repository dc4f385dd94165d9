//! F32 × 16 rows. Group block (2048 B) of 32 elements: for each element `i` the 16 rows' f32
//! weights side by side (64 B, one cache line), so one aligned load gives 16 rows of one
//! column. Activations are the f32 values themselves (4 B each), read with the FMA's
//! broadcast load. Decode of F32 weights streams them at memory speed this way; the unpacked
//! path dotted one row at a time.

/// Writes row `r`'s 32 f32 weights (128 B) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for i in 0..32 {
        dst[64 * i + 4 * r..][..4].copy_from_slice(&src[4 * i..][..4]);
    }
}

/// The inverse of [`pack_block`].
pub(super) fn unpack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for i in 0..32 {
        dst[4 * i..][..4].copy_from_slice(&src[64 * i + 4 * r..][..4]);
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    (0..nb * 32)
        .map(|e| f(&w[64 * e + 4 * r..]) * f(&x[4 * e..]))
        .sum()
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
    /// AVX-512 F present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx512f,fma")]
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
        let (w, x, xs) = (w as *const f32, x as *const f32, x_stride / 4);
        let mut f = [[_mm512_setzero_ps(); T]; 4];
        let mut e = 0;
        while e < nb * 32 {
            if pf != 0 {
                // Streaming the group from memory: ask for this step's lines (one an
                // element) `pf` bytes ahead. SAFETY: prefetching never faults.
                let ahead = (w as *const i8).wrapping_add(64 * e + pf);
                for line in 0..sets {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line));
                }
            }
            for (s, fs) in f.iter_mut().enumerate().take(sets) {
                // SAFETY: element e + s < nb·32 (sets divides 32) of the group and of every
                // token row is in bounds (caller).
                unsafe {
                    let wv = _mm512_loadu_ps(w.add(16 * (e + s)));
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
