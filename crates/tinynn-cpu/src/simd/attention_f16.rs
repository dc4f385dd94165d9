//! One query row's attention over an F16 KV cache for several query heads of one kv head, with
//! ggml's rounding (llama.cpp's CPU flash attention at decode): q rounded to f16, each score an
//! f16·f16 dot product, the online softmax with `expf`, and the value sum kept in f16 (every
//! multiply-add and rescale rounded). Each head's arithmetic is exactly what it would be alone;
//! the heads only share the reading (and f16 → f32 conversion) of every K and V row.
//!
//! [`attend_rows_ref`] is the generic version (the dot kernel of `dot_fn(F16)` and
//! `f16_accumulate`); the AVX-512 one and the AVX2 one (`attention_f16_avx2.rs`) keep the
//! operations of that level's kernels in the same order, so each agrees with it bit for bit
//! (tested).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{f16_accumulate, Isa};

/// Visible kv rows ahead of the current one whose K and V rows are prefetched: with several
/// sequences in the cache a query's rows are strided, and each row missed the caches (SmolLM2,
/// 4 sequences at ~150 tokens: ~90 ns a row and head, most of it waiting on loads).
const KV_AHEAD: usize = 8;

/// The K and V rows a query row attends to.
#[derive(Clone, Copy)]
pub(crate) struct KvRows<'a> {
    /// Row `j` of K starts at `k + j·k_stride` (`2·d` bytes of f16), of V at `v + j·v_stride`
    /// (`2·dv` bytes).
    pub k: *const u8,
    pub k_stride: usize,
    pub v: *const u8,
    pub v_stride: usize,
    /// The visible rows in order, each with its mask value (never −∞).
    pub rows: &'a [(usize, f32)],
    /// The F16 dot kernel of this machine (`dot_fn(F16)`), for the generic path.
    pub dot: super::DotFn,
}

impl KvRows<'_> {
    /// Prefetches the K and V rows of the first [`KV_AHEAD`] visible rows, which
    /// [`KvRows::prefetch_ahead`] never reaches: at a short context they are most of a head's
    /// rows, and after a layer's weights streamed through the caches they come from memory.
    #[inline]
    pub(super) fn prefetch_start(&self, d: usize, dv: usize) {
        for &(j, _) in self.rows.iter().take(KV_AHEAD) {
            super::prefetch(self.k.wrapping_add(j * self.k_stride), 2 * d);
            super::prefetch(self.v.wrapping_add(j * self.v_stride), 2 * dv);
        }
    }

    /// Prefetches the K and V rows (`2·d` and `2·dv` bytes) of the visible row
    /// [`KV_AHEAD`] past the `r`-th, if there is one.
    #[inline]
    pub(super) fn prefetch_ahead(&self, r: usize, d: usize, dv: usize) {
        if let Some(&(ahead, _)) = self.rows.get(r + KV_AHEAD) {
            super::prefetch(self.k.wrapping_add(ahead * self.k_stride), 2 * d);
            super::prefetch(self.v.wrapping_add(ahead * self.v_stride), 2 * dv);
        }
    }
}

/// Appends to `out` the kv rows `j < n` whose mask value (`row[j·step]`; every row when there
/// is no mask) is not −∞, each with that value, in order.
///
/// # Safety
/// With a mask, `row[j·step]` is a readable f32 for every `j < n`.
pub(crate) unsafe fn visible_rows(
    mask: Option<(*const f32, usize)>,
    n: usize,
    out: &mut Vec<(usize, f32)>,
) {
    let Some((row, step)) = mask else {
        out.extend((0..n).map(|j| (j, 0.0)));
        return;
    };
    let mut j = 0;
    #[cfg(target_arch = "x86_64")]
    if step == 1 && Isa::detected() >= Isa::Avx512F {
        // SAFETY: AVX-512F present (checked); the mask row is contiguous here.
        j = unsafe { visible_rows_avx512(row, n, out) };
    } else if step == 1 && Isa::detected() >= Isa::Avx2 {
        // SAFETY: AVX2 present (checked); the mask row is contiguous here.
        j = unsafe { super::attention_f16_avx2::visible_rows(row, n, out) };
    }
    for j in j..n {
        // SAFETY: j < n (caller).
        let m = unsafe { row.add(j * step).read() };
        if m != f32::NEG_INFINITY {
            out.push((j, m));
        }
    }
}

/// [`visible_rows`] for a contiguous mask row, 16 values at a time; returns how far it got
/// (the rest, under 16, is left to the caller).
///
/// # Safety
/// AVX-512F present; `row[0..n]` readable.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn visible_rows_avx512(row: *const f32, n: usize, out: &mut Vec<(usize, f32)>) -> usize {
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let mut j = 0;
    while j + 16 <= n {
        // SAFETY: j + 16 ≤ n (caller).
        let v = unsafe { _mm512_loadu_ps(row.add(j)) };
        // Unordered: a NaN counts as visible, as `m != −∞` says.
        let mut bits = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(v, ninf);
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            // SAFETY: j + b < n.
            out.push((j + b, unsafe { row.add(j + b).read() }));
            bits &= bits - 1;
        }
        j += 16;
    }
    j
}

/// One query row, `n` heads: `q` is `n × d` values exactly representable in f16 (and `q16`
/// the same as little-endian f16 bytes), `acc` is
/// `n × dv` (zeros on entry; on return the heads' unnormalized value sums), `max` and `sum`
/// `n` each (−∞ and 0 on entry; on return each head's softmax max and denominator).
pub(crate) struct HeadsState<'a> {
    pub q: &'a [f32],
    pub q16: &'a [u8],
    pub acc: &'a mut [f32],
    pub max: &'a mut [f32],
    pub sum: &'a mut [f32],
}

/// Runs the online softmax of every head in `st` over `kv`'s rows.
///
/// # Safety
/// Every row of `kv.rows` lies inside the K and V tensors (`2·d` and `2·dv` readable bytes at
/// its start), with `d = q.len() / n` and `dv = acc.len() / n` for `n = max.len()`.
pub(crate) unsafe fn attend_rows(
    kv: &KvRows<'_>,
    st: &mut HeadsState<'_>,
    scale: f32,
    softcap: f32,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let n = st.max.len();
        let (d, dv) = (st.q.len() / n, st.acc.len() / n);
        if Isa::detected() >= Isa::Avx512F
            && d % 16 == 0
            && dv % 16 == 0
            && d <= 512
            && n <= MAX_HEADS
        {
            // SAFETY: AVX-512F/F16C/FMA present (checked above); rows as the caller promises.
            return unsafe { attend_rows_avx512(kv, st, scale, softcap) };
        }
        if Isa::detected() >= Isa::Avx2 && super::attention_f16_avx2::fits(n, d, dv) {
            // SAFETY: AVX2/F16C/FMA present (checked above); rows as the caller promises.
            return unsafe { super::attention_f16_avx2::attend_rows(kv, st, scale, softcap) };
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { attend_rows_ref(kv, st, scale, softcap) }
}

/// [`attend_rows`] with the F16 dot kernel of this machine and the `f16_accumulate` helpers.
///
/// # Safety
/// As [`attend_rows`].
pub(crate) unsafe fn attend_rows_ref(
    kv: &KvRows<'_>,
    st: &mut HeadsState<'_>,
    scale: f32,
    softcap: f32,
) {
    let n = st.max.len();
    let (d, dv) = (st.q.len() / n, st.acc.len() / n);
    let (dot, q16) = (kv.dot, st.q16);
    kv.prefetch_start(d, dv);
    for (r, &(j, m)) in kv.rows.iter().enumerate() {
        kv.prefetch_ahead(r, d, dv);
        // SAFETY: row j of K and V holds 2·d and 2·dv bytes (caller).
        let (krow, vrow) = unsafe {
            (
                std::slice::from_raw_parts(kv.k.add(j * kv.k_stride), 2 * d),
                std::slice::from_raw_parts(kv.v.add(j * kv.v_stride), 2 * dv),
            )
        };
        for g in 0..n {
            let s = dot(krow, &q16[g * 2 * d..][..2 * d]) * scale;
            let Some((ms, vs)) = softmax_step(s, softcap, m, &mut st.max[g]) else {
                continue;
            };
            let acc = &mut st.acc[g * dv..][..dv];
            if ms != 1.0 {
                f16_accumulate::scale_f16_rounded(acc, ms);
            }
            f16_accumulate::mad_f16_rounded(acc, vrow, vs);
            st.sum[g] = st.sum[g] * ms + vs;
        }
    }
}

/// One row of a head's online softmax: the score `s` (scaled), capped, masked; `None` when it
/// is −∞, else the factor the old sum and values scale by and the row's weight.
#[inline]
fn softmax_step(mut s: f32, softcap: f32, m: f32, max: &mut f32) -> Option<(f32, f32)> {
    if softcap > 0.0 {
        s = softcap * (s / softcap).tanh();
    }
    s += m;
    if s == f32::NEG_INFINITY {
        return None;
    }
    Some(if s > *max {
        let ms = (*max - s).exp();
        *max = s;
        (ms, 1.0)
    } else {
        (1.0, (s - *max).exp())
    })
}

/// Each head's online softmax steps over one chunk of rows, in row order, from the chunk's
/// scaled scores: `step[g][r]` is the factor the old sums scale by and row r's weight (a
/// weight of −1, never a real one, marks a row the head skips). The running max and sum stay
/// in registers across the chunk (through memory, each row's update waited on the last one's
/// store); `sum · 1` is `sum`, so the multiply is skipped where the max did not move.
#[cfg(target_arch = "x86_64")]
pub(super) fn chunk_steps(
    chunk: &[(usize, f32)],
    score: &[[f32; CHUNK_ROWS]; MAX_HEADS],
    step: &mut [[(f32, f32); CHUNK_ROWS]; MAX_HEADS],
    st: &mut HeadsState<'_>,
    softcap: f32,
) {
    for g in 0..st.max.len() {
        let (mut max, mut sum) = (st.max[g], st.sum[g]);
        for (r, &(_, m)) in chunk.iter().enumerate() {
            step[g][r] = match softmax_step(score[g][r], softcap, m, &mut max) {
                Some((ms, vs)) => {
                    if ms != 1.0 {
                        sum *= ms;
                    }
                    sum += vs;
                    (ms, vs)
                }
                None => (1.0, -1.0),
            };
        }
        (st.max[g], st.sum[g]) = (max, sum);
    }
}

/// Rows the AVX-512 and AVX2 kernels take per pass: their scores first, then each head's
/// softmax steps, then the value sums. Split that way the work has no long dependency chain (a row
/// at a time, each head's value sum waited on its dot product's reduction and `expf`: SmolLM2
/// decode attention ran at ~200 cycles a row and head).
#[cfg(target_arch = "x86_64")]
pub(super) const CHUNK_ROWS: usize = 16;

/// Heads the AVX-512 and AVX2 kernels take in one pass (more go to the generic kernel).
#[cfg(target_arch = "x86_64")]
pub(super) const MAX_HEADS: usize = 8;

/// [`attend_rows`] in AVX-512: each K and V row converted to f32 once for all heads; per
/// chunk of rows, every head's scores (the dot kernel's order), then each head's online
/// softmax steps in row order, then the value sums in row order — each head's operations and
/// their order are those of the generic kernels.
///
/// # Safety
/// As [`attend_rows`], plus AVX-512F, F16C and FMA present, `d` and `dv` multiples of 16,
/// `d ≤ 512`, at most [`MAX_HEADS`] heads.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn attend_rows_avx512(kv: &KvRows<'_>, st: &mut HeadsState<'_>, scale: f32, softcap: f32) {
    let n = st.max.len();
    let (d, dv) = (st.q.len() / n, st.acc.len() / n);
    let (qp, ap) = (st.q.as_ptr(), st.acc.as_mut_ptr());
    let mut kf = [_mm512_setzero_ps(); 32];
    // Per head and chunk row: the dot product's 16 partial sums (reduced 16 rows at a time,
    // in the F16 dot kernel's order), the score, then the rescale of the old sums and the
    // row's weight (a weight of −1, never a real one, marks a row the head skips).
    let mut dots = [[_mm512_setzero_ps(); CHUNK_ROWS]; MAX_HEADS];
    let mut score = [[0f32; CHUNK_ROWS]; MAX_HEADS];
    let mut step = [[(1f32, 0f32); CHUNK_ROWS]; MAX_HEADS];
    let scale16 = _mm512_set1_ps(scale);
    kv.prefetch_start(d, dv);
    for (c0, chunk) in kv.rows.chunks(CHUNK_ROWS).enumerate() {
        for (r, &(j, _)) in chunk.iter().enumerate() {
            kv.prefetch_ahead(c0 * CHUNK_ROWS + r, d, dv);
            // SAFETY: row j of K holds d f16s (caller); q holds n·d f32s.
            unsafe {
                let krow = kv.k.add(j * kv.k_stride);
                match d / 16 {
                    4 => row_dots::<4>(krow, qp, n, &mut dots, r),
                    8 => row_dots::<8>(krow, qp, n, &mut dots, r),
                    _ => {
                        for (c, kc) in kf.iter_mut().enumerate().take(d / 16) {
                            *kc = _mm512_cvtph_ps(_mm256_loadu_si256(
                                krow.add(32 * c) as *const __m256i
                            ));
                        }
                        for (g, dg) in dots.iter_mut().enumerate().take(n) {
                            // The F16 dot kernel's order: one accumulator over the chunks,
                            // then its sum.
                            let mut dot = _mm512_setzero_ps();
                            for (c, &kc) in kf.iter().enumerate().take(d / 16) {
                                let qc = _mm512_loadu_ps(qp.add(g * d + 16 * c));
                                dot = _mm512_fmadd_ps(kc, qc, dot);
                            }
                            dg[r] = dot;
                        }
                    }
                }
            }
        }
        // Lane r of a head's sums depends on row r's partials alone, so rows past the end of
        // a short chunk (left from the chunk before) only fill lanes nobody reads.
        for (dg, sg) in dots.iter().zip(score.iter_mut()).take(n) {
            let sums = _mm512_mul_ps(super::hsum512::hsum_x16(dg), scale16);
            // SAFETY: sg holds CHUNK_ROWS = 16 floats.
            unsafe { _mm512_storeu_ps(sg.as_mut_ptr(), sums) };
        }
        chunk_steps(chunk, &score, &mut step, st, softcap);
        // SAFETY: the caller's contract (rows inside V; acc holds n·dv f32s).
        if unsafe { value_sums_in_registers(kv, chunk, &step, ap, n, dv) } {
            continue;
        }
        for (r, &(j, _)) in chunk.iter().enumerate() {
            // SAFETY: row j of V holds dv f16s (caller); acc holds n·dv f32s.
            unsafe {
                let vrow = kv.v.add(j * kv.v_stride);
                for c in 0..dv / 16 {
                    let vc =
                        _mm512_cvtph_ps(_mm256_loadu_si256(vrow.add(32 * c) as *const __m256i));
                    for (g, sg) in step.iter().enumerate().take(n) {
                        let (ms, vs) = sg[r];
                        if vs < 0.0 {
                            continue;
                        }
                        let acc = ap.add(g * dv + 16 * c);
                        let mut a = _mm512_loadu_ps(acc);
                        if ms != 1.0 {
                            a = round16(_mm512_mul_ps(a, _mm512_set1_ps(ms)));
                        }
                        _mm512_storeu_ps(acc, round16(_mm512_fmadd_ps(vc, _mm512_set1_ps(vs), a)));
                    }
                }
            }
        }
    }
}

/// One K row's dot products with `n` heads' queries (`D` vectors of 16 values each), into
/// `dots[g][r]`: the generic loop in [`attend_rows_avx512`] unrolled for a head size, the same
/// operations in the same order.
///
/// # Safety
/// AVX-512F and F16C present; `krow` holds `16·D` f16s, `qp` `n·16·D` f32s; `n ≤ MAX_HEADS`,
/// `r < CHUNK_ROWS`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn row_dots<const D: usize>(
    krow: *const u8,
    qp: *const f32,
    n: usize,
    dots: &mut [[__m512; CHUNK_ROWS]; MAX_HEADS],
    r: usize,
) {
    let mut kf = [_mm512_setzero_ps(); D];
    for (c, kc) in kf.iter_mut().enumerate() {
        // SAFETY: krow holds 16·D f16s (caller).
        *kc = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(krow.add(32 * c) as *const __m256i)) };
    }
    for (g, dg) in dots.iter_mut().enumerate().take(n) {
        let mut dot = _mm512_setzero_ps();
        for (c, &kc) in kf.iter().enumerate() {
            // SAFETY: qp holds n·16·D f32s (caller).
            let qc = unsafe { _mm512_loadu_ps(qp.add((g * D + c) * 16)) };
            dot = _mm512_fmadd_ps(kc, qc, dot);
        }
        dg[r] = dot;
    }
}

/// The value sums of one chunk of rows with every head's sums held in registers across the
/// chunk (`N` heads of `V` vectors of 16): the same per-lane operations in the same row order
/// as the loop in [`attend_rows_avx512`], without a load and a store of each sum per row.
/// Returns false, doing nothing, for shapes it has no instance for.
///
/// # Safety
/// As [`attend_rows_avx512`]; `chunk` rows inside V, `ap` holds `n·dv` f32s.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn value_sums_in_registers(
    kv: &KvRows<'_>,
    chunk: &[(usize, f32)],
    step: &[[(f32, f32); CHUNK_ROWS]; MAX_HEADS],
    ap: *mut f32,
    n: usize,
    dv: usize,
) -> bool {
    // SAFETY (each arm): forwarded from the caller; N = n heads of V·16 = dv values.
    unsafe {
        match (n, dv) {
            (1, 64) => value_sums::<1, 4>(kv, chunk, step, ap),
            (2, 64) => value_sums::<2, 4>(kv, chunk, step, ap),
            (3, 64) => value_sums::<3, 4>(kv, chunk, step, ap),
            (4, 64) => value_sums::<4, 4>(kv, chunk, step, ap),
            (1, 128) => value_sums::<1, 8>(kv, chunk, step, ap),
            (2, 128) => value_sums::<2, 8>(kv, chunk, step, ap),
            _ => return false,
        }
    }
    true
}

/// [`value_sums_in_registers`] for `N` heads of `16·V` values.
///
/// # Safety
/// As [`value_sums_in_registers`], with `n = N`, `dv = 16·V`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn value_sums<const N: usize, const V: usize>(
    kv: &KvRows<'_>,
    chunk: &[(usize, f32)],
    step: &[[(f32, f32); CHUNK_ROWS]; MAX_HEADS],
    ap: *mut f32,
) {
    let dv = 16 * V;
    let mut acc = [[_mm512_setzero_ps(); V]; N];
    for (g, ag) in acc.iter_mut().enumerate() {
        for (c, a) in ag.iter_mut().enumerate() {
            // SAFETY: head g's sums are dv f32s at ap + g·dv (caller).
            *a = unsafe { _mm512_loadu_ps(ap.add(g * dv + 16 * c)) };
        }
    }
    for (r, &(j, _)) in chunk.iter().enumerate() {
        let mut vc = [_mm512_setzero_ps(); V];
        for (c, x) in vc.iter_mut().enumerate() {
            // SAFETY: row j of V holds dv f16s (caller).
            *x = unsafe {
                let vrow = kv.v.add(j * kv.v_stride);
                _mm512_cvtph_ps(_mm256_loadu_si256(vrow.add(32 * c) as *const __m256i))
            };
        }
        for (g, ag) in acc.iter_mut().enumerate() {
            let (ms, vs) = step[g][r];
            if vs < 0.0 {
                continue;
            }
            if ms != 1.0 {
                let m = _mm512_set1_ps(ms);
                for a in ag.iter_mut() {
                    *a = round16(_mm512_mul_ps(*a, m));
                }
            }
            let w = _mm512_set1_ps(vs);
            for (a, &x) in ag.iter_mut().zip(&vc) {
                *a = round16(_mm512_fmadd_ps(x, w, *a));
            }
        }
    }
    for (g, ag) in acc.iter().enumerate() {
        for (c, &a) in ag.iter().enumerate() {
            // SAFETY: as above.
            unsafe { _mm512_storeu_ps(ap.add(g * dv + 16 * c), a) };
        }
    }
}

/// Each lane rounded to the nearest f16 (ties to even), as f32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
fn round16(x: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinynn_core::quant::half;
    use tinynn_core::rng::Rng;
    use tinynn_format::GgmlType;

    fn noise(n: usize, rng: &mut Rng, amp: f32) -> Vec<f32> {
        (0..n).map(|_| rng.range_f32(-amp, amp)).collect()
    }

    fn f16_bytes(x: &[f32]) -> Vec<u8> {
        x.iter()
            .flat_map(|&v| half::f32_to_f16(v).to_le_bytes())
            .collect()
    }

    type Result4 = (Vec<f32>, Vec<f32>, Vec<f32>);

    fn run(
        f: unsafe fn(&KvRows<'_>, &mut HeadsState<'_>, f32, f32),
        kv: &KvRows<'_>,
        q: &[f32],
        (n, dv): (usize, usize),
        softcap: f32,
    ) -> Result4 {
        let (mut acc, mut max, mut sum) =
            (vec![0.0; n * dv], vec![f32::NEG_INFINITY; n], vec![0.0; n]);
        let q16 = f16_bytes(q);
        let mut st = HeadsState {
            q,
            q16: &q16,
            acc: &mut acc,
            max: &mut max,
            sum: &mut sum,
        };
        // SAFETY: the rows index inside the K and V buffers of the caller.
        unsafe { f(kv, &mut st, 0.125, softcap) };
        (acc, max, sum)
    }

    /// The 16-at-a-time scan of a mask row lists the same rows and values as the scalar one,
    /// over lengths around the vector width and masks with NaN and −∞ runs.
    #[test]
    fn visible_rows_matches_scalar_scan() {
        let mut seed = Rng::new(0x51_7CC1_B727_220A);
        for n in [0usize, 1, 15, 16, 17, 31, 33, 100, 257] {
            let row: Vec<f32> = noise(n, &mut seed, 1.0)
                .into_iter()
                .enumerate()
                .map(|(j, x)| match (j * 7 + n) % 5 {
                    0 | 1 => f32::NEG_INFINITY,
                    2 if j % 11 == 3 => f32::NAN,
                    _ => x,
                })
                .collect();
            let want: Vec<(usize, u32)> = (0..n)
                .filter(|&j| row[j] != f32::NEG_INFINITY)
                .map(|j| (j, row[j].to_bits()))
                .collect();
            for step in [1, 2] {
                let wide: Vec<f32> = row.iter().flat_map(|&x| [x, 0.5]).collect();
                let (p, len) = if step == 1 {
                    (row.as_ptr(), n)
                } else {
                    (wide.as_ptr(), n)
                };
                let mut got = Vec::new();
                // SAFETY: row (or wide at stride 2) holds n readable values.
                unsafe { visible_rows(Some((p, step)), len, &mut got) };
                let got: Vec<(usize, u32)> = got.iter().map(|&(j, m)| (j, m.to_bits())).collect();
                assert_eq!(got, want, "n {n} step {step}");
            }
            // The AVX2 scan directly (an AVX-512 run dispatches to the other one), its tail
            // by hand.
            #[cfg(target_arch = "x86_64")]
            if crate::simd::Isa::available().contains(&crate::simd::Isa::Avx2) {
                let mut got = Vec::new();
                // SAFETY: AVX2 present (checked); row holds n readable values.
                let done = unsafe {
                    crate::simd::attention_f16_avx2::visible_rows(row.as_ptr(), n, &mut got)
                };
                got.extend(
                    (done..n)
                        .filter(|&j| row[j] != f32::NEG_INFINITY)
                        .map(|j| (j, row[j])),
                );
                let got: Vec<(usize, u32)> = got.iter().map(|&(j, m)| (j, m.to_bits())).collect();
                assert_eq!(got, want, "AVX2 scan, n {n}");
            }
            let mut all = Vec::new();
            // SAFETY: no mask: nothing is read.
            unsafe { visible_rows(None, n, &mut all) };
            assert_eq!(all.len(), n);
        }
    }

    /// The dispatching kernel (AVX-512 or AVX2, as `TINYNN_ISA` and the CPU allow) equals the
    /// generic one bit for bit, over head counts, sizes, masks (skipped and biased rows),
    /// softcap and row strides.
    #[test]
    fn fast_path_equals_generic_bit_for_bit() {
        let fast = crate::simd::Isa::detected() >= crate::simd::Isa::Avx2;
        if !crate::simd::required_by_test("the SIMD decode attention", fast) {
            return;
        }
        compare(attend_rows, crate::simd::dot_fn(GgmlType::F16).unwrap());
    }

    /// The AVX2 kernel equals the generic one with the AVX2 F16 dot, whatever the level in use
    /// (so an AVX-512 run tests it too).
    #[test]
    fn avx2_kernel_equals_generic_bit_for_bit() {
        let avx2 = crate::simd::Isa::available().contains(&crate::simd::Isa::Avx2);
        if !crate::simd::required_by_test("AVX2", avx2) {
            return;
        }
        compare(
            avx2_dispatch,
            crate::simd::avx2::dot_fn(GgmlType::F16).unwrap(),
        );
    }

    /// The AVX2 kernel where its shape rules allow it, else the generic one.
    unsafe fn avx2_dispatch(kv: &KvRows<'_>, st: &mut HeadsState<'_>, scale: f32, softcap: f32) {
        let n = st.max.len();
        let (d, dv) = (st.q.len() / n, st.acc.len() / n);
        // SAFETY: AVX2 present (the test checked); the shape rules of the AVX2 kernel hold on
        // the first branch; rows as the caller promises.
        unsafe {
            if crate::simd::attention_f16_avx2::fits(n, d, dv) {
                crate::simd::attention_f16_avx2::attend_rows(kv, st, scale, softcap)
            } else {
                attend_rows_ref(kv, st, scale, softcap)
            }
        }
    }

    /// `fast` against the generic kernel with the dot kernel `dot`, bit for bit.
    fn compare(
        fast: unsafe fn(&KvRows<'_>, &mut HeadsState<'_>, f32, f32),
        dot: crate::simd::DotFn,
    ) {
        let mut seed = Rng::new(0x9E37_79B9_7F4A_7C15);
        for &(n, d, dv, n_rows) in &[
            (1, 64, 64, 1),
            (3, 64, 64, 37),
            (2, 64, 64, 100),
            (4, 64, 64, 70),
            (1, 128, 128, 40),
            (2, 128, 128, 200),
            (8, 64, 64, 513),
            (4, 256, 256, 50),
            (5, 16, 32, 9),
            (2, 48, 80, 17),
            (3, 32, 40, 33),
            (2, 64, 120, 21),
        ] {
            for softcap in [0.0, 30.0] {
                let stride_rows = 3; // rows interleaved with two other sequences'
                let k = f16_bytes(&noise(n_rows * stride_rows * d, &mut seed, 2.0));
                let v = f16_bytes(&noise(n_rows * stride_rows * dv, &mut seed, 1.0));
                let q: Vec<f32> = noise(n * d, &mut seed, 3.0)
                    .into_iter()
                    .map(|x| half::f16_to_f32(half::f32_to_f16(x)))
                    .collect();
                let bias = noise(n_rows, &mut seed, 1.0);
                let rows: Vec<(usize, f32)> = (0..n_rows)
                    .filter(|r| r % 5 != 3)
                    .map(|r| {
                        (
                            r * stride_rows + r % stride_rows,
                            if r % 4 == 0 { bias[r] } else { 0.0 },
                        )
                    })
                    .collect();
                let kv = KvRows {
                    k: k.as_ptr(),
                    k_stride: 2 * d,
                    v: v.as_ptr(),
                    v_stride: 2 * dv,
                    rows: &rows,
                    dot,
                };
                let fast = run(fast, &kv, &q, (n, dv), softcap);
                let slow = run(attend_rows_ref, &kv, &q, (n, dv), softcap);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&fast.0),
                    bits(&slow.0),
                    "acc n{n} d{d} dv{dv} rows{n_rows}"
                );
                assert_eq!(bits(&fast.1), bits(&slow.1), "max n{n} d{d}");
                assert_eq!(bits(&fast.2), bits(&slow.2), "sum n{n} d{d}");
                assert!(fast.2.iter().all(|&s| s > 0.0));
            }
        }
    }
}
