//! The decode attention of `attention_f16.rs` (one query row, the heads of one kv head, an F16
//! KV cache, ggml's rounding) in AVX2: where AVX-512 is absent, the generic kernel ran each row
//! and head as a chain — a dot product, its reduction, `expf`, then the value sum waiting on
//! all of it. Here, as in the AVX-512 kernel, each chunk of rows gets every head's scores
//! first, then the heads' softmax steps, then the value sums with each head's sums held in
//! registers across the chunk.
//!
//! The operations and their order are those of the generic kernel at this level, so the two
//! agree bit for bit (`attention_f16.rs`'s tests): a score is the AVX2 F16 dot's (two 8-lane
//! accumulators over 16-value steps, added, then `avx2::hsum`) times the scale; a value sum
//! is `f16_accumulate`'s AVX2 loop (scale, round to f16; one FMA, round to f16).
//!
//! Safety contract of this file: every function is called only where `Isa::detected()`
//! reports AVX2 (which includes FMA and F16C).

use std::arch::x86_64::*;

use super::attention_f16::{chunk_steps, HeadsState, KvRows, CHUNK_ROWS, MAX_HEADS};

/// `attention_f16::visible_rows` for a contiguous mask row, 8 values at a time; returns how far
/// it got (the rest, under 8, is left to the caller).
///
/// # Safety
/// AVX2 present; `row[0..n]` readable.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn visible_rows(row: *const f32, n: usize, out: &mut Vec<(usize, f32)>) -> usize {
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut j = 0;
    while j + 8 <= n {
        // SAFETY: j + 8 ≤ n (caller).
        let v = unsafe { _mm256_loadu_ps(row.add(j)) };
        // Unordered: a NaN counts as visible, as `m != −∞` says.
        let mut bits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_NEQ_UQ>(v, ninf)) as u32;
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            // SAFETY: j + b < n.
            out.push((j + b, unsafe { row.add(j + b).read() }));
            bits &= bits - 1;
        }
        j += 8;
    }
    j
}

/// Whether [`attend_rows`] takes `n` heads of `d`-value keys and `dv`-value values: `d` a
/// multiple of 16 and at most 512 (its K row in registers), `dv` a multiple of 8, at most
/// [`MAX_HEADS`] heads.
pub(super) fn fits(n: usize, d: usize, dv: usize) -> bool {
    d.is_multiple_of(16) && d <= 512 && dv.is_multiple_of(8) && n <= MAX_HEADS
}

/// `attention_f16::attend_rows` in AVX2.
///
/// # Safety
/// As `attention_f16::attend_rows`, plus AVX2 present and [`fits`] for the shape.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn attend_rows(
    kv: &KvRows<'_>,
    st: &mut HeadsState<'_>,
    scale: f32,
    softcap: f32,
) {
    let n = st.max.len();
    let (d, dv) = (st.q.len() / n, st.acc.len() / n);
    debug_assert!(fits(n, d, dv));
    let qp = st.q.as_ptr();
    let mut kf = [_mm256_setzero_ps(); 64];
    let mut score = [[0f32; CHUNK_ROWS]; MAX_HEADS];
    let mut step = [[(1f32, 0f32); CHUNK_ROWS]; MAX_HEADS];
    kv.prefetch_start(d, dv);
    for (c0, chunk) in kv.rows.chunks(CHUNK_ROWS).enumerate() {
        for (r, &(j, _)) in chunk.iter().enumerate() {
            kv.prefetch_ahead(c0 * CHUNK_ROWS + r, d, dv);
            // SAFETY: row j of K holds d f16s (caller); q holds n·d f32s.
            unsafe {
                let krow = kv.k.add(j * kv.k_stride);
                for (c, kc) in kf.iter_mut().enumerate().take(d / 8) {
                    *kc = _mm256_cvtph_ps(_mm_loadu_si128(krow.add(16 * c) as *const __m128i));
                }
                for (g, sg) in score.iter_mut().enumerate().take(n) {
                    // The AVX2 F16 dot's order: values 16i..16i+8 into the first
                    // accumulator, 16i+8..16i+16 into the second, then their sum reduced.
                    let q = qp.add(g * d);
                    let mut acc = [_mm256_setzero_ps(); 2];
                    for c in (0..d / 8).step_by(2) {
                        acc[0] = _mm256_fmadd_ps(kf[c], _mm256_loadu_ps(q.add(8 * c)), acc[0]);
                        acc[1] =
                            _mm256_fmadd_ps(kf[c + 1], _mm256_loadu_ps(q.add(8 * c + 8)), acc[1]);
                    }
                    sg[r] = super::avx2::hsum(_mm256_add_ps(acc[0], acc[1])) * scale;
                }
            }
        }
        chunk_steps(chunk, &score, &mut step, st, softcap);
        let ap = st.acc.as_mut_ptr();
        for (g, sg) in step.iter().enumerate().take(n) {
            // The head's sums 64 values at a time, then the rest in 32, 16 and 8.
            let mut c = 0;
            // SAFETY (each call): head g's sums are dv f32s at ap + g·dv, c + 8·V ≤ dv; the
            // chunk's rows are inside V (caller).
            unsafe {
                while c + 64 <= dv {
                    value_sums::<8>(kv, chunk, sg, ap.add(g * dv + c), c);
                    c += 64;
                }
                if c + 32 <= dv {
                    value_sums::<4>(kv, chunk, sg, ap.add(g * dv + c), c);
                    c += 32;
                }
                if c + 16 <= dv {
                    value_sums::<2>(kv, chunk, sg, ap.add(g * dv + c), c);
                    c += 16;
                }
                if c + 8 <= dv {
                    value_sums::<1>(kv, chunk, sg, ap.add(g * dv + c), c);
                }
            }
        }
    }
}

/// `8·V` of one head's value sums (at `acc`; elements `c..c + 8·V` of each V row) over the
/// chunk's rows in order, held in registers: per row the old sums scaled and rounded to f16
/// where the max moved, then one FMA with the row's weight, rounded to f16.
///
/// # Safety
/// AVX2 present; `acc` holds `8·V` f32s; every chunk row of V holds `c + 8·V` f16s.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn value_sums<const V: usize>(
    kv: &KvRows<'_>,
    chunk: &[(usize, f32)],
    step: &[(f32, f32); CHUNK_ROWS],
    acc: *mut f32,
    c: usize,
) {
    let mut a = [_mm256_setzero_ps(); V];
    for (i, x) in a.iter_mut().enumerate() {
        // SAFETY: acc holds 8·V f32s (caller).
        *x = unsafe { _mm256_loadu_ps(acc.add(8 * i)) };
    }
    for (r, &(j, _)) in chunk.iter().enumerate() {
        let (ms, vs) = step[r];
        if vs < 0.0 {
            continue;
        }
        if ms != 1.0 {
            let m = _mm256_set1_ps(ms);
            for x in a.iter_mut() {
                *x = round16(_mm256_mul_ps(*x, m));
            }
        }
        let w = _mm256_set1_ps(vs);
        // SAFETY: row j of V holds c + 8·V f16s (caller).
        let vrow = unsafe { kv.v.add(j * kv.v_stride + 2 * c) };
        for (i, x) in a.iter_mut().enumerate() {
            // SAFETY: as above.
            let vi =
                unsafe { _mm256_cvtph_ps(_mm_loadu_si128(vrow.add(16 * i) as *const __m128i)) };
            *x = round16(_mm256_fmadd_ps(vi, w, *x));
        }
    }
    for (i, x) in a.iter().enumerate() {
        // SAFETY: as above.
        unsafe { _mm256_storeu_ps(acc.add(8 * i), *x) };
    }
}

/// Each lane rounded to the nearest f16 (ties to even), as f32.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn round16(x: __m256) -> __m256 {
    _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}
