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
//! summation order, never on its tile mates or the thread count. Written once over
//! [`Lanes16`]: one AVX-512 register or two AVX2 ones, the same bits.

#[cfg(target_arch = "x86_64")]
use super::attention_block::{lane_dots, lane_dots4, wide};
use super::attention_block::{LANES, MAX_D};
#[cfg(target_arch = "x86_64")]
use super::lanes16::{Lanes16, Pair, Wide};
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
pub(crate) unsafe fn query_tile(
    io: &BackIo,
    hk: usize,
    lanes: &[(usize, usize)],
    s: &mut BackScratch,
) {
    if wide() {
        // SAFETY: the caller's contract; AVX-512 checked.
        unsafe { query_tile_avx512(io, hk, lanes, s) }
    } else {
        // SAFETY: the caller's contract (AVX2, FMA, F16C).
        unsafe { query_tile_avx2(io, hk, lanes, s) }
    }
}

/// [`query_tile_with`] compiled for AVX-512.
///
/// # Safety
/// As [`query_tile`]; AVX-512 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")]
unsafe fn query_tile_avx512(io: &BackIo, hk: usize, lanes: &[(usize, usize)], s: &mut BackScratch) {
    // SAFETY: the caller's contract.
    unsafe { query_tile_with::<Wide>(io, hk, lanes, s) }
}

/// [`query_tile_with`] compiled for AVX2.
///
/// # Safety
/// As [`query_tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn query_tile_avx2(io: &BackIo, hk: usize, lanes: &[(usize, usize)], s: &mut BackScratch) {
    // SAFETY: the caller's contract.
    unsafe { query_tile_with::<Pair>(io, hk, lanes, s) }
}

/// The query tile over 16 lanes of either kind.
///
/// # Safety
/// As [`query_tile`]; `S`'s instruction set present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn query_tile_with<S: Lanes16>(
    io: &BackIo,
    hk: usize,
    lanes: &[(usize, usize)],
    s: &mut BackScratch,
) {
    let (d, n_q, n_head) = (io.q.layout.ne[0], io.q.layout.ne[1], io.q.layout.ne[2]);
    let (dv, n_kv) = (io.v.layout.ne[0], io.k.layout.ne[1]);
    let n = lanes.len();
    debug_assert!((1..=LANES).contains(&n) && d <= MAX_D && dv <= MAX_D);
    let live: u16 = if n == LANES { 0xFFFF } else { (1u16 << n) - 1 };
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
    let idx = unsafe { S::load_i(idx.as_ptr()) };
    let neg_inf = S::splat(f32::NEG_INFINITY);
    let scale = S::splat(io.scale);
    let mut max = neg_inf;
    // KV rows some lane sees: [lo, hi).
    let (mut lo, mut hi) = (n_kv, 0);
    let (mut pending, mut np) = ([0usize; 4], 0);
    for j in 0..n_kv {
        let m = match &io.mask {
            // SAFETY: element (j, i_l) is inside the mask for every live lane (caller).
            Some(mt) => unsafe {
                S::gather(
                    neg_inf,
                    live,
                    S::add_i(idx, S::splat_i(j as i32)),
                    mt.ptr as *const f32,
                )
            },
            None => S::blend(live, neg_inf, S::zero()),
        };
        if S::ne(m, neg_inf) == 0 {
            // SAFETY: row j of s and dp (sized above). Rows between seen ones must weigh 0.
            unsafe {
                S::store(s.s.as_mut_ptr().add(j * LANES), neg_inf);
                S::store(s.dp.as_mut_ptr().add(j * LANES), S::zero());
            }
            continue;
        }
        lo = lo.min(j);
        hi = j + 1;
        // The mask waits in row j of s until the scores of four rows are computed together.
        // SAFETY: row j of s (sized above).
        unsafe { S::store(s.s.as_mut_ptr().add(j * LANES), m) };
        pending[np] = j;
        np += 1;
        if np == 4 {
            // SAFETY: rows of k and v (caller), rows of s and dp.
            unsafe { query_scores::<S>(io, hk, &pending, s, scale, &mut max) };
            np = 0;
        }
    }
    for &j in &pending[..np] {
        // SAFETY: as above, one row at a time.
        unsafe { query_scores::<S>(io, hk, &[j], s, scale, &mut max) };
    }
    // Rows with nothing to attend to (every score −∞) get lse = +∞, zero gradients.
    let has = S::ne(max, neg_inf) & live;
    let (mut sum, mut pdp) = (S::zero(), S::zero());
    for j in lo..hi {
        // SAFETY: row j of s and dp (sized above).
        unsafe {
            let ps = s.s.as_mut_ptr().add(j * LANES);
            let e = S::blend(has, S::zero(), S::exp(S::sub(S::load(ps), max)));
            S::store(ps, e);
            sum = S::add(sum, e);
            pdp = S::fmadd(e, S::load(s.dp.as_ptr().add(j * LANES)), pdp);
        }
    }
    let inv = S::blend(has, S::zero(), S::div(S::splat(1.0), sum));
    let dsum = S::mul(pdp, inv);
    for j in lo..hi {
        // SAFETY: row j of s and dp.
        unsafe {
            let p = S::mul(S::load(s.s.as_ptr().add(j * LANES)), inv);
            let pd = s.dp.as_mut_ptr().add(j * LANES);
            let ds = S::mul(S::mul(p, S::sub(S::load(pd), dsum)), scale);
            S::store(pd, ds);
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
            accumulate_rows::<S>(
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
        S::store(mx.as_mut_ptr(), max);
        S::store(sm.as_mut_ptr(), sum);
        S::store(ds.as_mut_ptr(), dsum);
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
pub(crate) unsafe fn kv_tile(
    io: &BackIo,
    hk: usize,
    j0: usize,
    n: usize,
    group: usize,
    s: &mut BackScratch,
) {
    if wide() {
        // SAFETY: the caller's contract; AVX-512 checked.
        unsafe { kv_tile_avx512(io, hk, j0, n, group, s) }
    } else {
        // SAFETY: the caller's contract (AVX2, FMA, F16C).
        unsafe { kv_tile_avx2(io, hk, j0, n, group, s) }
    }
}

/// [`kv_tile_with`] compiled for AVX-512.
///
/// # Safety
/// As [`kv_tile`]; AVX-512 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")]
unsafe fn kv_tile_avx512(
    io: &BackIo,
    hk: usize,
    j0: usize,
    n: usize,
    group: usize,
    s: &mut BackScratch,
) {
    // SAFETY: the caller's contract.
    unsafe { kv_tile_with::<Wide>(io, hk, j0, n, group, s) }
}

/// [`kv_tile_with`] compiled for AVX2.
///
/// # Safety
/// As [`kv_tile`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn kv_tile_avx2(
    io: &BackIo,
    hk: usize,
    j0: usize,
    n: usize,
    group: usize,
    s: &mut BackScratch,
) {
    // SAFETY: the caller's contract.
    unsafe { kv_tile_with::<Pair>(io, hk, j0, n, group, s) }
}

/// The KV tile over 16 lanes of either kind.
///
/// # Safety
/// As [`kv_tile`]; `S`'s instruction set present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn kv_tile_with<S: Lanes16>(
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
    let live: u16 = if n == LANES { 0xFFFF } else { (1u16 << n) - 1 };
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
    let neg_inf = S::splat(f32::NEG_INFINITY);
    let scale = S::splat(io.scale);
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
                    S::load_masked(
                        neg_inf,
                        live,
                        (mt.ptr.add(i * mt.layout.nb[1]) as *const f32).add(j0),
                    )
                },
                None => S::blend(live, neg_inf, S::zero()),
            };
            if S::ne(m, neg_inf) == 0 {
                continue;
            }
            q_rows[nb] = io.q.row_f32_ptr(i, h, 0);
            o_rows[nb] = io.d_out.row_f32_ptr(h, i, 0);
            stats[nb] = (lse as f32, dsum as f32);
            // The mask waits in row nb of s until the block's scores are computed.
            // SAFETY: row nb < BLOCK of s.
            unsafe { S::store(s.s.as_mut_ptr().add(nb * LANES), m) };
            nb += 1;
            if nb == BLOCK {
                // SAFETY: BLOCK rows of s/dp, q rows of d and dO rows of dv values.
                unsafe { kv_block::<S>(s, &q_rows, &o_rows, &stats, scale, live, d, dv) };
                nb = 0;
            }
        }
    }
    if nb > 0 {
        // SAFETY: as above, nb rows.
        unsafe {
            kv_block::<S>(
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
/// `S`'s instruction set; rows `(j, hk)` of k and v exist, rows j of `s.s`/`s.dp`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn query_scores<S: Lanes16>(
    io: &BackIo,
    hk: usize,
    js: &[usize],
    s: &mut BackScratch,
    scale: S::V,
    max: &mut S::V,
) {
    let (d, dv) = (io.q.layout.ne[0], io.v.layout.ne[0]);
    let mut sc = [S::zero(); 4];
    let mut dp = [S::zero(); 4];
    // SAFETY: the caller's contract.
    unsafe {
        if js.len() == 4 {
            let k: [*const f32; 4] =
                std::array::from_fn(|r| io.k.row_f32_ptr(js[r], hk, 0) as *const f32);
            let v: [*const f32; 4] =
                std::array::from_fn(|r| io.v.row_f32_ptr(js[r], hk, 0) as *const f32);
            sc = lane_dots4::<S>(&s.a_t, k, d);
            dp = lane_dots4::<S>(&s.b_t, v, dv);
        } else {
            sc[0] = lane_dots::<S>(
                &s.a_t,
                std::slice::from_raw_parts(io.k.row_f32_ptr(js[0], hk, 0), d),
                d,
            );
            dp[0] = lane_dots::<S>(
                &s.b_t,
                std::slice::from_raw_parts(io.v.row_f32_ptr(js[0], hk, 0), dv),
                dv,
            );
        }
        for (r, &j) in js.iter().enumerate() {
            let ps = s.s.as_mut_ptr().add(j * LANES);
            let v = S::fmadd(sc[r], scale, S::load(ps));
            S::store(ps, v);
            S::store(s.dp.as_mut_ptr().add(j * LANES), dp[r]);
            *max = S::max(*max, v);
        }
    }
}

/// A KV tile's block of queries (their masks in `s.s`, `(lse, D)` in `stats`): `p` into
/// `s.s`, `ds` into `s.dp` (scores four queries at a time), then [`flush`].
///
/// # Safety
/// `S`'s instruction set; `q_rows`/`o_rows` hold d / dv values each, one per row of `s.s`/`s.dp`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn kv_block<S: Lanes16>(
    s: &mut BackScratch,
    q_rows: &[*const f32],
    o_rows: &[*const f32],
    stats: &[(f32, f32)],
    scale: S::V,
    live: u16,
    d: usize,
    dv: usize,
) {
    let nb = q_rows.len();
    let mut r0 = 0;
    while r0 < nb {
        let w = if nb - r0 >= 4 { 4 } else { 1 };
        let mut sc = [S::zero(); 4];
        let mut dp = [S::zero(); 4];
        // SAFETY: the caller's contract.
        unsafe {
            if w == 4 {
                sc = lane_dots4::<S>(&s.a_t, std::array::from_fn(|r| q_rows[r0 + r]), d);
                dp = lane_dots4::<S>(&s.b_t, std::array::from_fn(|r| o_rows[r0 + r]), dv);
            } else {
                sc[0] = lane_dots::<S>(&s.a_t, std::slice::from_raw_parts(q_rows[r0], d), d);
                dp[0] = lane_dots::<S>(&s.b_t, std::slice::from_raw_parts(o_rows[r0], dv), dv);
            }
            for r in 0..w {
                let (lse, dsum) = stats[r0 + r];
                let ps = s.s.as_mut_ptr().add((r0 + r) * LANES);
                let sc = S::fmadd(sc[r], scale, S::load(ps));
                let p = S::exp(S::sub(sc, S::splat(lse)));
                let p = S::blend(live, S::zero(), p);
                let ds = S::mul(S::mul(p, S::sub(dp[r], S::splat(dsum))), scale);
                S::store(ps, p);
                S::store(s.dp.as_mut_ptr().add((r0 + r) * LANES), ds);
            }
        }
        r0 += w;
    }
    // SAFETY: the caller's contract.
    unsafe { flush::<S>(s, q_rows, o_rows, d, dv) };
}

/// `dk += Σ ds·q`, `dv += Σ p·dO` over the collected queries.
///
/// # Safety
/// `S`'s instruction set; `s.s`/`s.dp` hold `q_rows.len()` rows; the row pointers hold d / dv values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn flush<S: Lanes16>(
    s: &mut BackScratch,
    q_rows: &[*const f32],
    o_rows: &[*const f32],
    d: usize,
    dv: usize,
) {
    let nb = q_rows.len();
    // SAFETY: see the function's contract.
    unsafe {
        accumulate_rows::<S>(&mut s.acc1, &s.dp[..nb * LANES], q_rows, d);
        accumulate_rows::<S>(&mut s.acc2, &s.s[..nb * LANES], o_rows, dv);
    }
}

/// `acc[c][·] += Σ_r w[r][·] · rows[r][c]` for `c < width` (`acc` `[width][16]`, `w`
/// `[rows][16]`), eight columns in registers at a time (four on AVX2), rows in order.
///
/// # Safety
/// `S`'s instruction set; `acc` holds `width` rows of 16, `w` `rows.len()` rows of 16, each row pointer
/// `width` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate_rows<S: Lanes16>(
    acc: &mut [f32],
    w: &[f32],
    rows: &[*const f32],
    width: usize,
) {
    let mut c = 0;
    while S::WIDE && c + 8 <= width {
        // SAFETY: columns c..c+8 < width.
        unsafe { accumulate_cols::<S, 8>(acc, w, rows, c) };
        c += 8;
    }
    // AVX2: 8 sums are 16 registers, which spill; 4 are 8.
    while !S::WIDE && c + 4 <= width {
        // SAFETY: columns c..c+4 < width.
        unsafe { accumulate_cols::<S, 4>(acc, w, rows, c) };
        c += 4;
    }
    while c < width {
        // SAFETY: column c < width.
        unsafe { accumulate_cols::<S, 1>(acc, w, rows, c) };
        c += 1;
    }
}

/// [`accumulate_rows`] for columns `c..c + W`.
///
/// # Safety
/// As [`accumulate_rows`], `c + W ≤ width`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate_cols<S: Lanes16, const W: usize>(
    acc: &mut [f32],
    w: &[f32],
    rows: &[*const f32],
    c: usize,
) {
    let mut r = [S::zero(); W];
    for (t, rt) in r.iter_mut().enumerate() {
        // SAFETY: row c + t of acc.
        *rt = unsafe { S::load(acc.as_ptr().add((c + t) * LANES)) };
    }
    for (jj, &row) in rows.iter().enumerate() {
        // SAFETY: row jj of w; value c + t of the row.
        unsafe {
            let wj = S::load(w.as_ptr().add(jj * LANES));
            for (t, rt) in r.iter_mut().enumerate() {
                *rt = S::fmadd(wj, S::splat(*row.add(c + t)), *rt);
            }
        }
    }
    for (t, rt) in r.iter().enumerate() {
        // SAFETY: row c + t of acc.
        unsafe { S::store(acc.as_mut_ptr().add((c + t) * LANES), *rt) };
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn query_tile(_: &BackIo, _: usize, _: &[(usize, usize)], _: &mut BackScratch) {
    unreachable!("attention_back tiles are only offered where AVX2 or AVX-512 is available");
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
    unreachable!("attention_back tiles are only offered where AVX2 or AVX-512 is available");
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
