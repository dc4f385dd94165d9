//! The tile kernel of the float kinds whose 16 rows of one element fill one vector: F16
//! (`f16x16`, 32 B an element, converted with `vcvtph2ps`) and F32 (`f32x16`, 64 B, loaded as
//! it is). Activations are f32 (F16's rounded to f16), read with the FMA's broadcast load.

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::{tile as tile_avx2, MAX_TOKENS as AVX2_MAX_TOKENS};
#[cfg(target_arch = "x86_64")]
pub(super) use avx512::{tile, tile_pair};

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `T` tokens × 16 rows over `nb` blocks of 32 elements, F32 weights when `F32`, else F16.
    /// Small tiles (decode) split the elements over several accumulators so the FMA latency
    /// does not bound them.
    ///
    /// # Safety
    /// AVX-512 F + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx512f,f16c,fma")]
    pub(in super::super) unsafe fn tile<const T: usize, const F32: bool>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        // Bytes of the 16 rows' weights of one element.
        let step = if F32 { 64 } else { 32 };
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
                // Streaming the group from memory: ask for this step's lines `pf` bytes ahead.
                crate::simd::prefetch(w.wrapping_add(step * e + pf), step * sets);
            }
            for (s, fs) in f.iter_mut().enumerate().take(sets) {
                // SAFETY: element e + s < nb·32 (sets divides 32) of the group and of every
                // token row is in bounds (caller).
                unsafe {
                    let at = w.add(step * (e + s));
                    let wv = if F32 {
                        _mm512_loadu_ps(at as *const f32)
                    } else {
                        _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i))
                    };
                    for (t, ft) in fs.iter_mut().enumerate() {
                        let xv = _mm512_set1_ps(x.add(t * xs + e + s).read_unaligned());
                        *ft = _mm512_fmadd_ps(wv, xv, *ft);
                    }
                }
            }
            e += sets;
        }
        // SAFETY: the `valid` columns of every token's output row are this thread's (caller).
        unsafe { super::super::store_summed(&f[..sets], out, out_stride, valid) };
    }

    /// `T` tokens × 32 rows: two neighbouring groups (the second `gb` bytes after the first,
    /// whose 16 rows are all valid) in one pass, so each broadcast activation feeds two FMAs
    /// and the kernel is bound by its FMAs rather than its loads (prefill). One accumulator
    /// per token and group summing the elements in order, as [`tile`] does for `T ≥ 5`: the
    /// same results, bit for bit.
    ///
    /// # Safety
    /// AVX-512 F + F16C present; both groups in bounds; pointers as in
    /// `super::super::TileFn`, the output covering 16 + `valid_b` columns.
    #[target_feature(enable = "avx512f,f16c,fma")]
    #[allow(clippy::too_many_arguments)]
    pub(in super::super) unsafe fn tile_pair<const T: usize, const F32: bool>(
        group: super::super::GroupIn,
        gb: usize,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid_b: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let step = if F32 { 64 } else { 32 };
        let (x, xs) = (x as *const f32, x_stride / 4);
        let load = |at: *const u8| {
            // SAFETY: `at` is one element's 16 weights inside a group (callers below).
            unsafe {
                if F32 {
                    _mm512_loadu_ps(at as *const f32)
                } else {
                    _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i))
                }
            }
        };
        let mut fa = [_mm512_setzero_ps(); T];
        let mut fb = [_mm512_setzero_ps(); T];
        for e in 0..nb * 32 {
            if pf != 0 && e % 4 == 0 {
                crate::simd::prefetch(w.wrapping_add(step * e + pf), step * 4);
                crate::simd::prefetch(w.wrapping_add(gb + step * e + pf), step * 4);
            }
            // SAFETY: element e < nb·32 of both groups and of every token row is in bounds
            // (caller).
            unsafe {
                let (wa, wb) = (load(w.add(step * e)), load(w.add(gb + step * e)));
                for t in 0..T {
                    let xv = _mm512_set1_ps(x.add(t * xs + e).read_unaligned());
                    fa[t] = _mm512_fmadd_ps(wa, xv, fa[t]);
                    fb[t] = _mm512_fmadd_ps(wb, xv, fb[t]);
                }
            }
        }
        // SAFETY: 16 columns of the first group and `valid_b` of the second, of every token's
        // output row, are this thread's (caller).
        unsafe {
            super::super::store_summed(&[fa], out, out_stride, 16);
            super::super::store_summed(&[fb], out.add(16), out_stride, valid_b);
        }
    }
}

/// The AVX2 twin of [`tile`]: 8 rows a ymm. One token (decode): both halves per pass; 2 to 4
/// tokens, half after half; both with the AVX-512 tile's accumulator sets; 5 or 6 tokens (one set, as the AVX-512 tile from 5 on), both
/// halves in one pass so each broadcast activation feeds two FMAs (12 accumulators). Each lane
/// sums its products in the AVX-512 tile's order, so both give the same bits.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// Most tokens of one AVX2 tile (the two-half pass keeps 2·T accumulators in registers).
    pub(in super::super) const MAX_TOKENS: usize = 6;

    /// `T` (≤ [`MAX_TOKENS`]) tokens × 16 rows over `nb` blocks of 32 elements, F32 weights
    /// when `F32`, else F16.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx2,f16c,fma")]
    pub(in super::super) unsafe fn tile<const T: usize, const F32: bool>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let step = if F32 { 64 } else { 32 };
        let (x, xs) = (x as *const f32, x_stride / 4);
        // Rows 8h..8h+8 of element e.
        let load = |e: usize, h: usize| {
            // SAFETY: element e < nb·32 of the group (callers below).
            unsafe {
                let at = w.add(step * e + step / 2 * h);
                if F32 {
                    _mm256_loadu_ps(at as *const f32)
                } else {
                    _mm256_cvtph_ps(_mm_loadu_si128(at as *const __m128i))
                }
            }
        };
        let store = |h: usize, t: usize, v: __m256| {
            let rows = valid.saturating_sub(8 * h).min(8);
            if rows == 0 {
                // No column of this half exists (its address may lie past the output).
                return;
            }
            // SAFETY: the `valid` columns of token t's output row are this thread's (caller).
            unsafe { crate::simd::store_first_lanes8(out.add(t * out_stride + 8 * h), rows, v) };
        };
        if T >= 5 {
            // Per token, the two halves' accumulators.
            let mut f = [[_mm256_setzero_ps(); 2]; T];
            for e in 0..nb * 32 {
                if pf != 0 && e % 4 == 0 {
                    crate::simd::prefetch(w.wrapping_add(step * e + pf), step * 4);
                }
                let (w0, w1) = (load(e, 0), load(e, 1));
                for (t, ft) in f.iter_mut().enumerate() {
                    // SAFETY: element e of token t's row (caller).
                    let xv = _mm256_set1_ps(unsafe { x.add(t * xs + e).read_unaligned() });
                    ft[0] = _mm256_fmadd_ps(w0, xv, ft[0]);
                    ft[1] = _mm256_fmadd_ps(w1, xv, ft[1]);
                }
            }
            for (t, ft) in f.iter().enumerate() {
                store(0, t, ft[0]);
                store(1, t, ft[1]);
            }
            return;
        }
        if T == 1 {
            // Decode: both halves per pass (each weight line read once), 4 sets of
            // accumulators as the AVX-512 tile keeps them: 8 registers.
            let mut f = [[_mm256_setzero_ps(); 2]; 4];
            let mut e = 0;
            while e < nb * 32 {
                if pf != 0 {
                    crate::simd::prefetch(w.wrapping_add(step * e + pf), step * 4);
                }
                for (s, fs) in f.iter_mut().enumerate() {
                    // SAFETY: element e + s of the token's row (caller).
                    let xv = _mm256_set1_ps(unsafe { x.add(e + s).read_unaligned() });
                    fs[0] = _mm256_fmadd_ps(load(e + s, 0), xv, fs[0]);
                    fs[1] = _mm256_fmadd_ps(load(e + s, 1), xv, fs[1]);
                }
                e += 4;
            }
            // The sets summed in order, as the AVX-512 tile's store does.
            let sum = |h: usize| {
                _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(f[0][h], f[1][h]), f[2][h]),
                    f[3][h],
                )
            };
            store(0, 0, sum(0));
            store(1, 0, sum(1));
            return;
        }
        let sets = if T <= 2 { 4 } else { 2 };
        for h in 0..2 {
            if valid <= 8 * h {
                break;
            }
            let mut f = [[_mm256_setzero_ps(); T]; 4];
            let mut e = 0;
            while e < nb * 32 {
                if pf != 0 && h == 0 {
                    crate::simd::prefetch(w.wrapping_add(step * e + pf), step * sets);
                }
                for (s, fs) in f.iter_mut().enumerate().take(sets) {
                    let wv = load(e + s, h);
                    for (t, ft) in fs.iter_mut().enumerate() {
                        // SAFETY: element e + s of token t's row (caller).
                        let xv = _mm256_set1_ps(unsafe { x.add(t * xs + e + s).read_unaligned() });
                        *ft = _mm256_fmadd_ps(wv, xv, *ft);
                    }
                }
                e += sets;
            }
            for t in 0..T {
                let mut sum = f[0][t];
                for fs in &f[1..sets] {
                    sum = _mm256_add_ps(sum, fs[t]);
                }
                store(h, t, sum);
            }
        }
    }
}
