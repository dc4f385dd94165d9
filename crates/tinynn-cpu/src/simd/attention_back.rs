//! AVX-512 gradient of attention with F32 q/k/v (training), no softcap. Two phases, each over
//! tiles of 16 lanes so every vector operation is full width and nothing is reduced
//! horizontally:
//!
//! - **Query tiles** (16 (query row, head) pairs of one KV head, as the forward's tiles): the
//!   scores `s = q·k·scale + mask` and `dp = dO·v` of every KV row (queries and dO
//!   transposed, `[d][16]`), then per lane `max`, `Σ exp(s − max)`, the log-sum-exp,
//!   `D = Σ p·dp` (= dO·O), `ds = p·(dp − D)·scale` and `dq = Σ_j ds_j·k_j`. The log-sum-exp
//!   and `D` go to the work buffer.
//! - **KV tiles** (16 KV rows of one KV head): for every query of the group's heads (in order)
//!   that the mask leaves any of the 16 rows, `p = exp(s − lse)`, `ds`, and
//!   `dk += ds·q`, `dv += p·dO`, queries taken 16 at a time with the sums in registers.
//!
//! KV rows (query tiles) and queries (KV tiles) the mask hides from every lane are skipped, so
//! a causal mask costs half. A lane's result depends on nothing but its own row and the fixed
//! summation order, never on its tile mates or the thread count.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::attention_block::{lane_dots, lane_dots4};
use super::attention_block::{LANES, MAX_D};
#[cfg(target_arch = "x86_64")]
use super::vexp;
use crate::kernels::RawTensor;

/// Rows summed per register pass (KV rows in `dq`, queries in `dk`/`dv`).
const BLOCK: usize = 32;

/// Everything the tiles read and write.
pub(crate) struct BackIo {
    /// F32 `[d, n_q, n_head]`, contiguous rows.
    pub q: RawTensor,
    /// F32 `[d, n_kv, n_head_kv]`, contiguous rows.
    pub k: RawTensor,
    /// F32 `[dv, n_kv, n_head_kv]`, contiguous rows.
    pub v: RawTensor,
    /// F32 `[n_kv, ≥ n_q]` with contiguous rows, added to the scores.
    pub mask: Option<RawTensor>,
    /// F32 `[dv, n_head, n_q]`, contiguous rows.
    pub d_out: RawTensor,
    pub scale: f32,
    /// The flat output: dq `[d, n_q, n_head]`, dk at `dk_at`, dv at `dv_at` (f32 elements).
    pub out: *mut f32,
    pub dk_at: usize,
    pub dv_at: usize,
    /// Per (head h, query i), slot `h + n_head·i`: log-sum-exp (+∞ for a row with nothing to
    /// attend to) and `D`, f64 pairs.
    pub stats: *mut f64,
}

/// One thread's scratch (grown on its first use, kept after).
pub(crate) struct BackScratch {
    /// q (query tiles) or k (KV tiles) transposed, `[d][16]`.
    a_t: Vec<f32>,
    /// dO (query tiles) or v (KV tiles) transposed, `[dv][16]`.
    b_t: Vec<f32>,
    /// dq (query tiles) or dk (KV tiles), `[d][16]`.
    acc1: Vec<f32>,
    /// dv (KV tiles), `[dv][16]`.
    acc2: Vec<f32>,
    /// Scores, then probabilities, `[rows][16]`.
    s: Vec<f32>,
    /// dp, then ds, `[rows][16]`.
    dp: Vec<f32>,
}

impl BackScratch {
    pub(crate) fn new() -> BackScratch {
        BackScratch {
            a_t: vec![0.0; MAX_D * LANES],
            b_t: vec![0.0; MAX_D * LANES],
            acc1: vec![0.0; MAX_D * LANES],
            acc2: vec![0.0; MAX_D * LANES],
            s: Vec::new(),
            dp: Vec::new(),
        }
    }

    fn rows(&mut self, n: usize) {
        if self.s.len() < n * LANES {
            self.s.resize(n * LANES, 0.0);
            self.dp.resize(n * LANES, 0.0);
        }
    }
}

/// Query tile: dq rows and the stats of `lanes` (query row `i`, head `h`; all heads of KV
/// head `hk`), 1 to 16 of them.
///
/// # Safety
/// `attention_block::available()`; the tensors are as documented on [`BackIo`], `d, dv ≤
/// MAX_D`; the lanes' dq rows and stats slots belong to this thread.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) unsafe fn query_tile(
    io: &BackIo,
    hk: usize,
    lanes: &[(usize, usize)],
    s: &mut BackScratch,
) {
    let (d, n_q, n_head) = (io.q.layout.ne[0], io.q.layout.ne[1], io.q.layout.ne[2]);
    let (dv, n_kv) = (io.v.layout.ne[0], io.k.layout.ne[1]);
    let n = lanes.len();
    debug_assert!((1..=LANES).contains(&n) && d <= MAX_D && dv <= MAX_D);
    let live: __mmask16 = if n == LANES { 0xFFFF } else { (1u16 << n) - 1 };
    s.rows(n_kv);
    if n < LANES {
        s.a_t[..d * LANES].fill(0.0);
        s.b_t[..dv * LANES].fill(0.0);
    }
    for (l, &(i, h)) in lanes.iter().enumerate() {
        let (qr, dr) = (io.q.row_f32_ptr(i, h, 0), io.d_out.row_f32_ptr(h, i, 0));
        // SAFETY: row (i, h) of q holds d values, row (h, i) of dO dv values (caller).
        unsafe {
            for c in 0..d {
                s.a_t[c * LANES + l] = *qr.add(c);
            }
            for c in 0..dv {
                s.b_t[c * LANES + l] = *dr.add(c);
            }
        }
    }
    let mut idx = [0i32; LANES];
    if let Some(m) = &io.mask {
        for (l, &(i, _)) in lanes.iter().enumerate() {
            idx[l] = (i * m.layout.nb[1] / 4) as i32;
        }
    }
    // SAFETY: 16 i32s.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) };
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let scale = _mm512_set1_ps(io.scale);
    let mut max = neg_inf;
    // KV rows some lane sees: [lo, hi).
    let (mut lo, mut hi) = (n_kv, 0);
    let (mut pending, mut np) = ([0usize; 4], 0);
    for j in 0..n_kv {
        let m = match &io.mask {
            // SAFETY: element (j, i_l) is inside the mask for every live lane (caller).
            Some(mt) => unsafe {
                _mm512_mask_i32gather_ps::<4>(
                    neg_inf,
                    live,
                    _mm512_add_epi32(idx, _mm512_set1_epi32(j as i32)),
                    mt.ptr as *const f32,
                )
            },
            None => _mm512_mask_blend_ps(live, neg_inf, _mm512_setzero_ps()),
        };
        if _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(m, neg_inf) == 0 {
            // SAFETY: row j of s and dp (sized above). Rows between seen ones must weigh 0.
            unsafe {
                _mm512_storeu_ps(s.s.as_mut_ptr().add(j * LANES), neg_inf);
                _mm512_storeu_ps(s.dp.as_mut_ptr().add(j * LANES), _mm512_setzero_ps());
            }
            continue;
        }
        lo = lo.min(j);
        hi = j + 1;
        // The mask waits in row j of s until the scores of four rows are computed together.
        // SAFETY: row j of s (sized above).
        unsafe { _mm512_storeu_ps(s.s.as_mut_ptr().add(j * LANES), m) };
        pending[np] = j;
        np += 1;
        if np == 4 {
            // SAFETY: rows of k and v (caller), rows of s and dp.
            unsafe { query_scores(io, hk, &pending, s, scale, &mut max) };
            np = 0;
        }
    }
    for &j in &pending[..np] {
        // SAFETY: as above, one row at a time.
        unsafe { query_scores(io, hk, &[j], s, scale, &mut max) };
    }
    // Rows with nothing to attend to (every score −∞) get lse = +∞, zero gradients.
    let has = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(max, neg_inf) & live;
    let (mut sum, mut pdp) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    for j in lo..hi {
        // SAFETY: row j of s and dp (sized above).
        unsafe {
            let ps = s.s.as_mut_ptr().add(j * LANES);
            let e = _mm512_maskz_mov_ps(has, vexp::exp16(_mm512_sub_ps(_mm512_loadu_ps(ps), max)));
            _mm512_storeu_ps(ps, e);
            sum = _mm512_add_ps(sum, e);
            pdp = _mm512_fmadd_ps(e, _mm512_loadu_ps(s.dp.as_ptr().add(j * LANES)), pdp);
        }
    }
    let inv = _mm512_maskz_div_ps(has, _mm512_set1_ps(1.0), sum);
    let dsum = _mm512_mul_ps(pdp, inv);
    for j in lo..hi {
        // SAFETY: row j of s and dp.
        unsafe {
            let p = _mm512_mul_ps(_mm512_loadu_ps(s.s.as_ptr().add(j * LANES)), inv);
            let pd = s.dp.as_mut_ptr().add(j * LANES);
            let ds = _mm512_mul_ps(
                _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(pd), dsum)),
                scale,
            );
            _mm512_storeu_ps(pd, ds);
        }
    }
    // dq = Σ_j ds_j · k_j, BLOCK rows at a time.
    s.acc1[..d * LANES].fill(0.0);
    let mut rows = [std::ptr::null::<f32>(); BLOCK];
    let mut j0 = lo;
    while j0 < hi {
        let nb = BLOCK.min(hi - j0);
        for (t, r) in rows[..nb].iter_mut().enumerate() {
            *r = io.k.row_f32_ptr(j0 + t, hk, 0);
        }
        // SAFETY: rows j0..j0+nb of dp, k rows of d values, acc1 [d][16].
        unsafe {
            accumulate_rows(
                &mut s.acc1,
                &s.dp[j0 * LANES..(j0 + nb) * LANES],
                &rows[..nb],
                d,
            )
        };
        j0 += nb;
    }
    let (mut mx, mut sm, mut ds) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
    // SAFETY: 16 f32s each.
    unsafe {
        _mm512_storeu_ps(mx.as_mut_ptr(), max);
        _mm512_storeu_ps(sm.as_mut_ptr(), sum);
        _mm512_storeu_ps(ds.as_mut_ptr(), dsum);
    }
    for (l, &(i, h)) in lanes.iter().enumerate() {
        let live_row = has & (1 << l) != 0;
        let lse = if live_row {
            f64::from(mx[l]) + f64::from(sm[l]).ln()
        } else {
            f64::INFINITY
        };
        let slot = h + n_head * i;
        let row = d * (i + n_q * h);
        // SAFETY: dq row (i, h) and stats slot (h, i) are inside the output and the work
        // buffer, and this thread's (caller).
        unsafe {
            for c in 0..d {
                io.out.add(row + c).write(s.acc1[c * LANES + l]);
            }
            io.stats.add(2 * slot).write(lse);
            io.stats.add(2 * slot + 1).write(f64::from(ds[l]));
        }
    }
}

/// KV tile: dk and dv of KV rows `j0..j0 + n` (n ≤ 16) of KV head `hk`, summed over the
/// queries of heads `hk·group..(hk+1)·group` in order.
///
/// # Safety
/// As [`query_tile`]; every query tile has run (the stats are written); the KV rows' dk/dv
/// rows belong to this thread.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,fma")]
pub(crate) unsafe fn kv_tile(
    io: &BackIo,
    hk: usize,
    j0: usize,
    n: usize,
    group: usize,
    s: &mut BackScratch,
) {
    let (d, n_q, n_head) = (io.q.layout.ne[0], io.q.layout.ne[1], io.q.layout.ne[2]);
    let (dv, n_kv) = (io.v.layout.ne[0], io.k.layout.ne[1]);
    debug_assert!((1..=LANES).contains(&n) && d <= MAX_D && dv <= MAX_D);
    let live: __mmask16 = if n == LANES { 0xFFFF } else { (1u16 << n) - 1 };
    s.rows(BLOCK);
    if n < LANES {
        s.a_t[..d * LANES].fill(0.0);
        s.b_t[..dv * LANES].fill(0.0);
    }
    for l in 0..n {
        let (kr, vr) = (
            io.k.row_f32_ptr(j0 + l, hk, 0),
            io.v.row_f32_ptr(j0 + l, hk, 0),
        );
        // SAFETY: rows (j0 + l, hk) of k and v hold d and dv values (caller).
        unsafe {
            for c in 0..d {
                s.a_t[c * LANES + l] = *kr.add(c);
            }
            for c in 0..dv {
                s.b_t[c * LANES + l] = *vr.add(c);
            }
        }
    }
    s.acc1[..d * LANES].fill(0.0);
    s.acc2[..dv * LANES].fill(0.0);
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let scale = _mm512_set1_ps(io.scale);
    let (mut q_rows, mut o_rows) = (
        [std::ptr::null::<f32>(); BLOCK],
        [std::ptr::null::<f32>(); BLOCK],
    );
    let mut stats = [(0f32, 0f32); BLOCK];
    let mut nb = 0;
    for h in hk * group..(hk + 1) * group {
        for i in 0..n_q {
            let slot = h + n_head * i;
            // SAFETY: written by the query tiles (caller).
            let (lse, dsum) = unsafe {
                (
                    io.stats.add(2 * slot).read(),
                    io.stats.add(2 * slot + 1).read(),
                )
            };
            if lse == f64::INFINITY {
                continue;
            }
            let m = match &io.mask {
                // SAFETY: elements j0..j0+n of mask row i exist (caller).
                Some(mt) => unsafe {
                    _mm512_mask_loadu_ps(
                        neg_inf,
                        live,
                        (mt.ptr.add(i * mt.layout.nb[1]) as *const f32).add(j0),
                    )
                },
                None => _mm512_mask_blend_ps(live, neg_inf, _mm512_setzero_ps()),
            };
            if _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(m, neg_inf) == 0 {
                continue;
            }
            q_rows[nb] = io.q.row_f32_ptr(i, h, 0);
            o_rows[nb] = io.d_out.row_f32_ptr(h, i, 0);
            stats[nb] = (lse as f32, dsum as f32);
            // The mask waits in row nb of s until the block's scores are computed.
            // SAFETY: row nb < BLOCK of s.
            unsafe { _mm512_storeu_ps(s.s.as_mut_ptr().add(nb * LANES), m) };
            nb += 1;
            if nb == BLOCK {
                // SAFETY: BLOCK rows of s/dp, q rows of d and dO rows of dv values.
                unsafe { kv_block(s, &q_rows, &o_rows, &stats, scale, live, d, dv) };
                nb = 0;
            }
        }
    }
    if nb > 0 {
        // SAFETY: as above, nb rows.
        unsafe {
            kv_block(
                s,
                &q_rows[..nb],
                &o_rows[..nb],
                &stats[..nb],
                scale,
                live,
                d,
                dv,
            )
        };
    }
    for l in 0..n {
        let j = j0 + l;
        let (rk, rv) = (
            io.dk_at + d * (j + n_kv * hk),
            io.dv_at + dv * (j + n_kv * hk),
        );
        // SAFETY: dk and dv rows (j, hk) are inside the output and this thread's (caller).
        unsafe {
            for c in 0..d {
                io.out.add(rk + c).write(s.acc1[c * LANES + l]);
            }
            for c in 0..dv {
                io.out.add(rv + c).write(s.acc2[c * LANES + l]);
            }
        }
    }
}

/// Scores and dp of query-tile KV rows `js` (1 or 4; their masks in `s.s`): `s.s[j] =
/// q·k_j·scale + mask`, `s.dp[j] = dO·v_j`, and the running maximum.
///
/// # Safety
/// AVX-512F; rows `(j, hk)` of k and v exist, rows j of `s.s`/`s.dp`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn query_scores(
    io: &BackIo,
    hk: usize,
    js: &[usize],
    s: &mut BackScratch,
    scale: __m512,
    max: &mut __m512,
) {
    let (d, dv) = (io.q.layout.ne[0], io.v.layout.ne[0]);
    let mut sc = [_mm512_setzero_ps(); 4];
    let mut dp = [_mm512_setzero_ps(); 4];
    // SAFETY: the caller's contract.
    unsafe {
        if js.len() == 4 {
            let k: [*const f32; 4] =
                std::array::from_fn(|r| io.k.row_f32_ptr(js[r], hk, 0) as *const f32);
            let v: [*const f32; 4] =
                std::array::from_fn(|r| io.v.row_f32_ptr(js[r], hk, 0) as *const f32);
            sc = lane_dots4(&s.a_t, k, d);
            dp = lane_dots4(&s.b_t, v, dv);
        } else {
            sc[0] = lane_dots(
                &s.a_t,
                std::slice::from_raw_parts(io.k.row_f32_ptr(js[0], hk, 0), d),
                d,
            );
            dp[0] = lane_dots(
                &s.b_t,
                std::slice::from_raw_parts(io.v.row_f32_ptr(js[0], hk, 0), dv),
                dv,
            );
        }
        for (r, &j) in js.iter().enumerate() {
            let ps = s.s.as_mut_ptr().add(j * LANES);
            let v = _mm512_fmadd_ps(sc[r], scale, _mm512_loadu_ps(ps));
            _mm512_storeu_ps(ps, v);
            _mm512_storeu_ps(s.dp.as_mut_ptr().add(j * LANES), dp[r]);
            *max = _mm512_max_ps(*max, v);
        }
    }
}

/// A KV tile's block of queries (their masks in `s.s`, `(lse, D)` in `stats`): `p` into
/// `s.s`, `ds` into `s.dp` (scores four queries at a time), then [`flush`].
///
/// # Safety
/// AVX-512F; `q_rows`/`o_rows` hold d / dv values each, one per row of `s.s`/`s.dp`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kv_block(
    s: &mut BackScratch,
    q_rows: &[*const f32],
    o_rows: &[*const f32],
    stats: &[(f32, f32)],
    scale: __m512,
    live: __mmask16,
    d: usize,
    dv: usize,
) {
    let nb = q_rows.len();
    let mut r0 = 0;
    while r0 < nb {
        let w = if nb - r0 >= 4 { 4 } else { 1 };
        let mut sc = [_mm512_setzero_ps(); 4];
        let mut dp = [_mm512_setzero_ps(); 4];
        // SAFETY: the caller's contract.
        unsafe {
            if w == 4 {
                sc = lane_dots4(&s.a_t, std::array::from_fn(|r| q_rows[r0 + r]), d);
                dp = lane_dots4(&s.b_t, std::array::from_fn(|r| o_rows[r0 + r]), dv);
            } else {
                sc[0] = lane_dots(&s.a_t, std::slice::from_raw_parts(q_rows[r0], d), d);
                dp[0] = lane_dots(&s.b_t, std::slice::from_raw_parts(o_rows[r0], dv), dv);
            }
            for r in 0..w {
                let (lse, dsum) = stats[r0 + r];
                let ps = s.s.as_mut_ptr().add((r0 + r) * LANES);
                let sc = _mm512_fmadd_ps(sc[r], scale, _mm512_loadu_ps(ps));
                let p = vexp::exp16(_mm512_sub_ps(sc, _mm512_set1_ps(lse)));
                let p = _mm512_maskz_mov_ps(live, p);
                let ds = _mm512_mul_ps(
                    _mm512_mul_ps(p, _mm512_sub_ps(dp[r], _mm512_set1_ps(dsum))),
                    scale,
                );
                _mm512_storeu_ps(ps, p);
                _mm512_storeu_ps(s.dp.as_mut_ptr().add((r0 + r) * LANES), ds);
            }
        }
        r0 += w;
    }
    // SAFETY: the caller's contract.
    unsafe { flush(s, q_rows, o_rows, d, dv) };
}

/// `dk += Σ ds·q`, `dv += Σ p·dO` over the collected queries.
///
/// # Safety
/// AVX-512F; `s.s`/`s.dp` hold `q_rows.len()` rows; the row pointers hold d / dv values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn flush(
    s: &mut BackScratch,
    q_rows: &[*const f32],
    o_rows: &[*const f32],
    d: usize,
    dv: usize,
) {
    let nb = q_rows.len();
    // SAFETY: see the function's contract.
    unsafe {
        accumulate_rows(&mut s.acc1, &s.dp[..nb * LANES], q_rows, d);
        accumulate_rows(&mut s.acc2, &s.s[..nb * LANES], o_rows, dv);
    }
}

/// `acc[c][·] += Σ_r w[r][·] · rows[r][c]` for `c < width` (`acc` `[width][16]`, `w`
/// `[rows][16]`), eight columns in registers at a time, rows in order.
///
/// # Safety
/// AVX-512F; `acc` holds `width` rows of 16, `w` `rows.len()` rows of 16, each row pointer
/// `width` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate_rows(acc: &mut [f32], w: &[f32], rows: &[*const f32], width: usize) {
    let mut c = 0;
    while c + 8 <= width {
        // SAFETY: columns c..c+8 < width.
        unsafe { accumulate_cols::<8>(acc, w, rows, c) };
        c += 8;
    }
    while c < width {
        // SAFETY: column c < width.
        unsafe { accumulate_cols::<1>(acc, w, rows, c) };
        c += 1;
    }
}

/// [`accumulate_rows`] for columns `c..c + W`.
///
/// # Safety
/// As [`accumulate_rows`], `c + W ≤ width`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate_cols<const W: usize>(
    acc: &mut [f32],
    w: &[f32],
    rows: &[*const f32],
    c: usize,
) {
    let mut r = [_mm512_setzero_ps(); W];
    for (t, rt) in r.iter_mut().enumerate() {
        // SAFETY: row c + t of acc.
        *rt = unsafe { _mm512_loadu_ps(acc.as_ptr().add((c + t) * LANES)) };
    }
    for (jj, &row) in rows.iter().enumerate() {
        // SAFETY: row jj of w; value c + t of the row.
        unsafe {
            let wj = _mm512_loadu_ps(w.as_ptr().add(jj * LANES));
            for (t, rt) in r.iter_mut().enumerate() {
                *rt = _mm512_fmadd_ps(wj, _mm512_set1_ps(*row.add(c + t)), *rt);
            }
        }
    }
    for (t, rt) in r.iter().enumerate() {
        // SAFETY: row c + t of acc.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add((c + t) * LANES), *rt) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn query_tile(_: &BackIo, _: usize, _: &[(usize, usize)], _: &mut BackScratch) {
    unreachable!("attention_back tiles are only offered where AVX-512 is available");
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn kv_tile(
    _: &BackIo,
    _: usize,
    _: usize,
    _: usize,
    _: usize,
    _: &mut BackScratch,
) {
    unreachable!("attention_back tiles are only offered where AVX-512 is available");
}
