//! Attention for prompt batches (llama.cpp switches to the same arithmetic at 64 query rows):
//! queries in f32, KV rows in blocks of [`KV_BLOCK`], per block the running maximum moves
//! once, probabilities `exp(s − max)`, and the value sums accumulate in f32. With AVX-512 the
//! 16 lanes of a tile ((query row, head) pairs sharing a KV head) fill one vector everywhere:
//! scores (queries transposed), maxima, `exp`, and `acc[c] += p · v[c]` with the sums laid
//! out `[dv][16]`, so nothing is reduced horizontally. A lane's result does not depend on
//! its tile mates or the thread count. The tiles are written once over
//! [`Lanes16`](super::lanes16::Lanes16) and run as one AVX-512 register or two AVX2 ones,
//! with the same bits.

#[cfg(target_arch = "x86_64")]
use super::lanes16::{Lanes16, Pair, Wide};
use crate::kernels::RawTensor;

/// KV rows per block.
pub(crate) const KV_BLOCK: usize = 64;
/// Lanes per tile.
pub(crate) const LANES: usize = 16;
/// Largest head size (the graph builder's limit).
pub(crate) const MAX_D: usize = 512;

/// Whether [`attend_blocked`] can run here (AVX2 + FMA + F16C at least).
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx2
}

/// Whether the tiles run as AVX-512 ([`Wide`]) rather than AVX2 ([`Pair`]).
pub(crate) fn wide() -> bool {
    super::Isa::detected() >= super::Isa::Avx512F
}

/// Everything a tile reads and writes besides its lanes.
pub(crate) struct TileIo {
    /// F32 `[d, n_q, n_head]` (any strides).
    pub q: RawTensor,
    /// F16 `[d, n_kv, n_head_kv]` with contiguous rows.
    pub k: RawTensor,
    /// F16 `[dv, n_kv, n_head_kv]` with contiguous rows.
    pub v: RawTensor,
    /// F32 `[n_kv, ≥ n_q]`, added to the scores.
    pub mask: Option<RawTensor>,
    /// F32 `[dv, n_head, n_q]` with contiguous rows.
    pub dst: RawTensor,
    pub n_kv: usize,
    pub scale: f32,
}

/// Scratch for one tile (about 200 KiB; one per thread).
pub(crate) struct TileScratch {
    /// Queries transposed: `[d][16]`.
    q_t: Vec<f32>,
    /// Value sums, `[dv][16]`.
    acc: Vec<f32>,
    /// Scores, then probabilities, `[KV_BLOCK][16]`.
    p: Vec<f32>,
    /// The block's value rows in f32, `[KV_BLOCK][dv]`.
    v_blk: Vec<f32>,
    /// The block's key rows in f32, `[KV_BLOCK][d]`.
    k_blk: Vec<f32>,
}

impl TileScratch {
    pub(crate) fn new() -> TileScratch {
        TileScratch {
            q_t: vec![0.0; MAX_D * LANES],
            acc: vec![0.0; LANES * MAX_D],
            p: vec![0.0; KV_BLOCK * LANES],
            v_blk: vec![0.0; KV_BLOCK * MAX_D],
            k_blk: vec![0.0; KV_BLOCK * MAX_D],
        }
    }
}

/// Blocked f32 attention for `lanes` (query row `i`, head `h`; all heads of KV head `hk`).
///
/// # Safety
/// [`available`]; the tensors are as documented on [`TileIo`] and in bounds for the lanes and
/// `n_kv`; the lanes' output rows belong to this thread.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn attend_blocked(
    io: &TileIo,
    hk: usize,
    lanes: &[(usize, usize)],
    s: &mut TileScratch,
) {
    if wide() {
        // SAFETY: the caller's contract; AVX-512 checked.
        unsafe { attend_avx512(io, hk, lanes, s) }
    } else {
        // SAFETY: the caller's contract (AVX2, FMA and F16C: `available`).
        unsafe { attend_avx2(io, hk, lanes, s) }
    }
}

/// [`attend`] compiled for AVX-512.
///
/// # Safety
/// As [`attend_blocked`]; AVX-512 present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")]
unsafe fn attend_avx512(io: &TileIo, hk: usize, lanes: &[(usize, usize)], s: &mut TileScratch) {
    // SAFETY: the caller's contract.
    unsafe { attend::<Wide>(io, hk, lanes, s) }
}

/// [`attend`] compiled for AVX2.
///
/// # Safety
/// As [`attend_blocked`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_avx2(io: &TileIo, hk: usize, lanes: &[(usize, usize)], s: &mut TileScratch) {
    // SAFETY: the caller's contract.
    unsafe { attend::<Pair>(io, hk, lanes, s) }
}

/// The tile, over 16 lanes of either kind (inlined into the entry points above).
///
/// # Safety
/// As [`attend_blocked`]; `S`'s instruction set present.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn attend<S: Lanes16>(
    io: &TileIo,
    hk: usize,
    lanes: &[(usize, usize)],
    s: &mut TileScratch,
) {
    let (q, k, v) = (&io.q, &io.k, &io.v);
    let (d, dv) = (q.layout.ne[0], v.layout.ne[0]);
    let n = lanes.len();
    debug_assert!((1..=LANES).contains(&n) && d <= MAX_D && dv <= MAX_D);
    let live: u16 = if n == LANES { 0xFFFF } else { (1u16 << n) - 1 };
    // Lanes past `n` keep whatever they hold: `live`/`upd` mask them everywhere.
    let q_step = q.layout.nb[0] / 4;
    for (l, &(i, h)) in lanes.iter().enumerate() {
        // Element c of the row is q_step f32s after element c − 1 (F32, any strides).
        let row = q.ptr.wrapping_add(i * q.layout.nb[1] + h * q.layout.nb[2]) as *const f32;
        for c in 0..d {
            // SAFETY: (c, i, h) is inside q (caller); F32 data is 4-byte aligned.
            s.q_t[c * LANES + l] = unsafe { row.add(c * q_step).read() };
        }
    }
    s.acc[..dv * LANES].fill(0.0);
    // Only KV rows some lane can see: outside [first, last] every lane's mask is −∞, so
    // skipping them changes nothing.
    let vis = match &io.mask {
        // SAFETY: each lane's mask row holds n_kv F32 values (caller); S's ISA.
        Some(m) => unsafe { visibility::<S>(m, lanes, io.n_kv) },
        None => Visibility {
            first: 0,
            last: io.n_kv,
            ranges: None,
        },
    };
    let (first, last) = (vis.first, vis.last);
    // A mask of only 0 and −∞ with one visible run per lane (causal, windows) is rebuilt
    // from the runs' bounds; any other mask is gathered element by element.
    let (lo, hi) = match vis.ranges {
        // SAFETY: 16 i32s each.
        Some((lo, hi)) => unsafe { (S::load_i(lo.as_ptr()), S::load_i(hi.as_ptr())) },
        None => (S::splat_i(0), S::splat_i(0)),
    };
    let mut idx = [0i32; LANES];
    if let Some(m) = &io.mask {
        for (l, &(i, _)) in lanes.iter().enumerate() {
            idx[l] = (i * m.layout.nb[1] / 4) as i32;
        }
    }
    // SAFETY: 16 i32s.
    let idx = unsafe { S::load_i(idx.as_ptr()) };
    let neg_inf = S::splat(f32::NEG_INFINITY);
    let (mut max, mut sum) = (neg_inf, S::zero());
    let mut j0 = first;
    while j0 < last {
        let nb = KV_BLOCK.min(last - j0);
        // Masks first (kept in p), and the K rows some lane needs, in f32.
        let mut need = [false; KV_BLOCK];
        for (jj, nj) in need.iter_mut().enumerate().take(nb) {
            let j = j0 + jj;
            let m = match &io.mask {
                Some(_) if vis.ranges.is_some() => {
                    let jv = S::splat_i(j as i32);
                    let seen = S::ge_i(jv, lo) & S::lt_i(jv, hi);
                    S::blend(seen & live, neg_inf, S::zero())
                }
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
            // SAFETY: row jj < KV_BLOCK of p.
            unsafe { S::store(s.p.as_mut_ptr().add(jj * LANES), m) };
            *nj = S::ne(m, neg_inf) != 0;
            if *nj {
                // SAFETY: row (j, hk) of k is inside k, contiguous F16 or F32 (caller).
                unsafe { load_row::<S>(k, j, hk, &mut s.k_blk[jj * d..(jj + 1) * d]) };
            }
        }
        // Scores of the block, [nb][16], four K rows per pass over the queries; rows every
        // lane masks stay −∞.
        let mut blk_max = neg_inf;
        let mut jj = 0;
        while jj < nb {
            let rows = [0, 1, 2, 3].map(|r| (jj + r).min(nb - 1));
            if rows.iter().all(|&r| !need[r]) {
                for &r in rows.iter().take(nb - jj) {
                    // SAFETY: row r < KV_BLOCK of p.
                    unsafe { S::store(s.p.as_mut_ptr().add(r * LANES), neg_inf) };
                }
                jj += 4;
                continue;
            }
            let kp = rows.map(|r| s.k_blk[r * d..(r + 1) * d].as_ptr());
            // SAFETY: rows of k_blk hold d values each (stale rows are never used); q_t
            // holds d rows.
            let dots = unsafe { lane_dots4::<S>(&s.q_t, kp, d) };
            for (r, dot) in dots.iter().enumerate().take(nb - jj) {
                let row = jj + r;
                // SAFETY: row < KV_BLOCK of p (holding the mask).
                unsafe {
                    let pp = s.p.as_mut_ptr().add(row * LANES);
                    let score = if need[row] {
                        S::add(S::mul(*dot, S::splat(io.scale)), S::load(pp))
                    } else {
                        neg_inf
                    };
                    S::store(pp, score);
                    blk_max = S::max(blk_max, score);
                }
            }
            jj += 4;
        }
        let upd = S::ne(blk_max, neg_inf) & live;
        if upd == 0 {
            j0 += nb;
            continue;
        }
        let new_max = S::blend(upd, max, S::max(max, blk_max));
        let grew = S::gt(new_max, max) & upd;
        if grew != 0 {
            // SAFETY: S's ISA (caller).
            let e = unsafe { S::exp(S::sub(max, new_max)) };
            let ms = S::blend(grew, S::splat(1.0), e);
            sum = S::mul(sum, ms);
            for c in 0..dv {
                // SAFETY: row c < dv of acc ([dv][16]).
                unsafe {
                    let p = s.acc.as_mut_ptr().add(c * LANES);
                    S::store(p, S::mul(S::load(p), ms));
                }
            }
        }
        max = new_max;
        let mut psum = S::zero();
        for jj in 0..nb {
            // SAFETY: row jj of p; S's ISA (caller).
            unsafe {
                let pp = s.p.as_mut_ptr().add(jj * LANES);
                let e = S::exp(S::sub(S::load(pp), max));
                // Lanes without a finite score in this block (and masked entries, exp(−∞))
                // weigh nothing.
                let e = S::blend(upd, S::zero(), e);
                S::store(pp, e);
                psum = S::add(psum, e);
            }
            // SAFETY: row (j0 + jj, hk) of v is inside v, contiguous F16 or F32 (caller).
            unsafe { load_row::<S>(v, j0 + jj, hk, &mut s.v_blk[jj * dv..(jj + 1) * dv]) };
        }
        sum = S::add(sum, psum);
        // acc[c] += Σ_jj p[jj] · v[jj][c], eight value columns at a time in registers (four
        // with AVX2, whose 16 registers hold 8 only as 16 halves and spill).
        let mut c = 0;
        while c < dv {
            // SAFETY: rows c..c+8 (or c) of acc, rows jj < nb of p and v_blk (dv values each).
            unsafe {
                if S::WIDE && c + 8 <= dv {
                    accumulate::<S, 8>(&mut s.acc, &s.p, &s.v_blk, dv, nb, c);
                    c += 8;
                } else if !S::WIDE && c + 4 <= dv {
                    accumulate::<S, 4>(&mut s.acc, &s.p, &s.v_blk, dv, nb, c);
                    c += 4;
                } else {
                    accumulate::<S, 1>(&mut s.acc, &s.p, &s.v_blk, dv, nb, c);
                    c += 1;
                }
            }
        }
        j0 += nb;
    }
    let mut sums = [0f32; LANES];
    // SAFETY: 16 f32s.
    unsafe { S::store(sums.as_mut_ptr(), sum) };
    for (l, &(i, h)) in lanes.iter().enumerate() {
        let inv = if sums[l] > 0.0 { 1.0 / sums[l] } else { 0.0 };
        let out = io.dst.row_f32_ptr(h, i, 0);
        for c in 0..dv {
            // SAFETY: output row (h, i) is [dv] contiguous and this thread's (caller).
            unsafe { out.add(c).write(s.acc[c * LANES + l] * inv) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn attend_blocked(
    _: &TileIo,
    _: usize,
    _: &[(usize, usize)],
    _: &mut TileScratch,
) {
    unreachable!("attend_blocked is only offered where AVX2 or AVX-512 is available");
}

/// Which KV rows a tile's lanes can see.
struct Visibility {
    /// Outside `[first, last)` every lane's mask is −∞ (`first == last`: nothing visible).
    first: usize,
    last: usize,
    /// When every mask row is only 0 and −∞ with one run of zeros: each lane's run `[lo, hi)`.
    ranges: Option<([i32; LANES], [i32; LANES])>,
}

/// Scans each distinct mask row of the tile once (16 values per step).
///
/// # Safety
/// `S`'s ISA; the mask is F32 with contiguous rows; row `i` of every lane holds `n_kv` values
/// (fewer than 2³¹).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn visibility<S: Lanes16>(
    m: &RawTensor,
    lanes: &[(usize, usize)],
    n_kv: usize,
) -> Visibility {
    let neg_inf = S::splat(f32::NEG_INFINITY);
    let zero = S::zero();
    let (mut first, mut last) = (n_kv, 0);
    let (mut lo, mut hi) = ([0i32; LANES], [0i32; LANES]);
    let mut plain = true;
    let mut prev: Option<(usize, i32, i32)> = None;
    for (l, &(i, _)) in lanes.iter().enumerate() {
        let (r_lo, r_hi) = match prev {
            Some((pi, a, b)) if pi == i => (a, b),
            _ => {
                let row = m.row_f32_ptr(i, 0, 0) as *const f32;
                // First and last visible element, visible count, and whether all are 0.
                let (mut f, mut la, mut count) = (usize::MAX, 0usize, 0usize);
                let mut j = 0;
                while j < n_kv {
                    let w = (n_kv - j).min(16);
                    let k: u16 = if w == 16 { 0xFFFF } else { (1u16 << w) - 1 };
                    // SAFETY: values j..j + w of the row (caller).
                    let x = unsafe { S::load_masked(zero, k, row.add(j)) };
                    let vis = S::ne(x, neg_inf) & k;
                    if vis != 0 {
                        f = f.min(j + vis.trailing_zeros() as usize);
                        la = j + 16 - vis.leading_zeros() as usize;
                        count += vis.count_ones() as usize;
                        if S::ne(x, zero) & vis != 0 {
                            plain = false;
                        }
                    }
                    j += w;
                }
                if f == usize::MAX {
                    (0, 0)
                } else {
                    first = first.min(f);
                    last = last.max(la);
                    if count != la - f {
                        plain = false;
                    }
                    (f as i32, la as i32)
                }
            }
        };
        prev = Some((i, r_lo, r_hi));
        (lo[l], hi[l]) = (r_lo, r_hi);
    }
    if last <= first {
        (first, last) = (0, 0);
    }
    Visibility {
        first,
        last,
        ranges: plain.then_some((lo, hi)),
    }
}

/// Row `(j, hk)` of an F16 or F32 tensor with contiguous rows, as f32.
///
/// # Safety
/// `S`'s ISA; the row exists and holds `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn load_row<S: Lanes16>(t: &RawTensor, j: usize, hk: usize, out: &mut [f32]) {
    if t.layout.dtype == tinynn_format::GgmlType::F32 {
        // SAFETY: the row holds out.len() contiguous f32s (caller).
        let row = unsafe { std::slice::from_raw_parts(t.row_f32_ptr(j, hk, 0), out.len()) };
        out.copy_from_slice(row);
    } else {
        // SAFETY: the row holds out.len() contiguous f16s (caller).
        unsafe { f16_row_to_f32::<S>(t.row(j, hk, 0).as_ptr(), out) };
    }
}

/// 16 lane scores `Σ_c q_t[c][l] · k[c]` over 8 accumulators (the attention gradient's
/// one-row form).
///
/// # Safety
/// `S`'s ISA; `q_t` holds `d` rows of 16, `k` holds `d` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn lane_dots<S: Lanes16>(q_t: &[f32], k: &[f32], d: usize) -> S::V {
    let mut a = [S::zero(); 8];
    let mut c = 0;
    while c + 8 <= d {
        for (r, ar) in a.iter_mut().enumerate() {
            // SAFETY: c + r < d.
            let qv = unsafe { S::load(q_t.as_ptr().add((c + r) * LANES)) };
            *ar = S::fmadd(qv, S::splat(k[c + r]), *ar);
        }
        c += 8;
    }
    while c < d {
        // SAFETY: c < d.
        let qv = unsafe { S::load(q_t.as_ptr().add(c * LANES)) };
        a[c % 8] = S::fmadd(qv, S::splat(k[c]), a[c % 8]);
        c += 1;
    }
    // Written out, not `[..].map(..)`: the closure would run inside `array::map`, compiled
    // without the entry point's target features, where the intrinsics are calls.
    let a4 = [
        S::add(a[0], a[4]),
        S::add(a[1], a[5]),
        S::add(a[2], a[6]),
        S::add(a[3], a[7]),
    ];
    S::add(S::add(a4[0], a4[1]), S::add(a4[2], a4[3]))
}

/// Lane dots of four rows at once: `Σ_c t[c][l] · rows[r][c]` for r < 4, two accumulators
/// each (even and odd c), so each transposed vector loaded feeds four FMAs (the query tiles'
/// scores here; scores and dO·v in the gradient).
///
/// # Safety
/// `S`'s ISA; `t` holds `d` rows of 16, each row pointer `d` values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) unsafe fn lane_dots4<S: Lanes16>(
    t: &[f32],
    rows: [*const f32; 4],
    d: usize,
) -> [S::V; 4] {
    if S::WIDE {
        // SAFETY: the caller's contract.
        return unsafe { lane_dots_rows::<S, 4>(t, rows, d) };
    }
    // Two ymm registers a value: 4 rows' 8 sums, two rows of t and a broadcast would need
    // 21 of the 16 (spilled in every step); two rows at a time need 13. Each row's sums are
    // the same operations in the same order either way.
    // SAFETY: the caller's contract.
    let [a, b] = unsafe {
        [
            lane_dots_rows::<S, 2>(t, [rows[0], rows[1]], d),
            lane_dots_rows::<S, 2>(t, [rows[2], rows[3]], d),
        ]
    };
    [a[0], a[1], b[0], b[1]]
}

/// [`lane_dots4`] for `R` rows at once.
///
/// # Safety
/// As [`lane_dots4`].
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn lane_dots_rows<S: Lanes16, const R: usize>(
    t: &[f32],
    rows: [*const f32; R],
    d: usize,
) -> [S::V; R] {
    let mut a = [[S::zero(); 2]; R];
    let mut c = 0;
    while c + 2 <= d {
        // SAFETY: c + 1 < d rows of t and values of each row.
        unsafe {
            let t0 = S::load(t.as_ptr().add(c * LANES));
            let t1 = S::load(t.as_ptr().add((c + 1) * LANES));
            for (ar, &row) in a.iter_mut().zip(&rows) {
                ar[0] = S::fmadd(t0, S::splat(*row.add(c)), ar[0]);
                ar[1] = S::fmadd(t1, S::splat(*row.add(c + 1)), ar[1]);
            }
        }
        c += 2;
    }
    if c < d {
        // SAFETY: c < d.
        unsafe {
            let t0 = S::load(t.as_ptr().add(c * LANES));
            for (ar, &row) in a.iter_mut().zip(&rows) {
                ar[0] = S::fmadd(t0, S::splat(*row.add(c)), ar[0]);
            }
        }
    }
    // A loop, not `a.map(..)` (see `lane_dots`).
    let mut out = [S::zero(); R];
    for (o, ar) in out.iter_mut().zip(&a) {
        *o = S::add(ar[0], ar[1]);
    }
    out
}

/// `acc[c + r] += Σ_jj p[jj] · v_blk[jj][c + r]` for `r < W` (W a constant, so the sums
/// stay in registers).
///
/// # Safety
/// `S`'s ISA; the rows exist (see the caller).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn accumulate<S: Lanes16, const W: usize>(
    acc: &mut [f32],
    p: &[f32],
    v_blk: &[f32],
    dv: usize,
    nb: usize,
    c: usize,
) {
    let mut r = [S::zero(); W];
    for (t, rt) in r.iter_mut().enumerate() {
        // SAFETY: row c + t < dv of acc.
        *rt = unsafe { S::load(acc.as_ptr().add((c + t) * LANES)) };
    }
    for jj in 0..nb {
        // SAFETY: row jj of p; value (jj, c + t) of v_blk.
        unsafe {
            let pj = S::load(p.as_ptr().add(jj * LANES));
            let vrow = v_blk.as_ptr().add(jj * dv + c);
            for (t, rt) in r.iter_mut().enumerate() {
                *rt = S::fmadd(pj, S::splat(*vrow.add(t)), *rt);
            }
        }
    }
    for (t, rt) in r.iter().enumerate() {
        // SAFETY: row c + t < dv of acc.
        unsafe { S::store(acc.as_mut_ptr().add((c + t) * LANES), *rt) };
    }
}

/// `out[c] = f32(row[c])` for an F16 row.
///
/// # Safety
/// `S`'s ISA; `row` holds `out.len()` f16 values.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn f16_row_to_f32<S: Lanes16>(row: *const u8, out: &mut [f32]) {
    let n = out.len();
    let mut c = 0;
    while c + 16 <= n {
        // SAFETY: 16 f16s at row + 2c, 16 f32s at out[c..].
        unsafe {
            S::store(out.as_mut_ptr().add(c), S::load_f16(row.add(2 * c)));
        }
        c += 16;
    }
    for (x, cc) in out[c..].iter_mut().zip(c..) {
        // SAFETY: f16 cc is inside the row.
        let b = unsafe { [*row.add(2 * cc), *row.add(2 * cc + 1)] };
        *x = tinynn_core::quant::half::f16_to_f32(u16::from_le_bytes(b));
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
