//! Attention for prompt batches (llama.cpp switches to the same arithmetic at 64 query rows):
//! queries in f32, KV rows in blocks of [`KV_BLOCK`], per block the running maximum moves
//! once, probabilities `exp(s − max)`, and the value sums accumulate in f32. With AVX-512 the
//! 16 lanes of a tile ((query row, head) pairs sharing a KV head) fill one vector everywhere:
//! scores (queries transposed), maxima, `exp`, and `acc[c] += p · v[c]` with the sums laid
//! out `[dv][16]`, so nothing is reduced horizontally. A lane's result does not depend on
//! its tile mates or the thread count.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use super::vexp;
use crate::kernels::RawTensor;

/// KV rows per block.
pub(crate) const KV_BLOCK: usize = 64;
/// Lanes per tile.
pub(crate) const LANES: usize = 16;
/// Largest head size (the graph builder's limit).
pub(crate) const MAX_D: usize = 512;

/// Whether [`attend_blocked`] can run here.
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx512Vnni
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
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")]
pub(crate) unsafe fn attend_blocked(
    io: &TileIo,
    hk: usize,
    lanes: &[(usize, usize)],
    s: &mut TileScratch,
) {
    let (q, k, v) = (&io.q, &io.k, &io.v);
    let (d, dv) = (q.layout.ne[0], v.layout.ne[0]);
    let n = lanes.len();
    debug_assert!((1..=LANES).contains(&n) && d <= MAX_D && dv <= MAX_D);
    let live: __mmask16 = if n == LANES { 0xFFFF } else { (1u16 << n) - 1 };
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
        // SAFETY: each lane's mask row holds n_kv F32 values (caller); AVX-512F.
        Some(m) => unsafe { visibility(m, lanes, io.n_kv) },
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
        Some((lo, hi)) => unsafe {
            (
                _mm512_loadu_si512(lo.as_ptr() as *const __m512i),
                _mm512_loadu_si512(hi.as_ptr() as *const __m512i),
            )
        },
        None => (_mm512_setzero_si512(), _mm512_setzero_si512()),
    };
    let mut idx = [0i32; LANES];
    if let Some(m) = &io.mask {
        for (l, &(i, _)) in lanes.iter().enumerate() {
            idx[l] = (i * m.layout.nb[1] / 4) as i32;
        }
    }
    // SAFETY: 16 i32s.
    let idx = unsafe { _mm512_loadu_si512(idx.as_ptr() as *const __m512i) };
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let (mut max, mut sum) = (neg_inf, _mm512_setzero_ps());
    let mut j0 = first;
    while j0 < last {
        let nb = KV_BLOCK.min(last - j0);
        // Masks first (kept in p), and the K rows some lane needs, in f32.
        let mut need = [false; KV_BLOCK];
        for (jj, nj) in need.iter_mut().enumerate().take(nb) {
            let j = j0 + jj;
            let m = match &io.mask {
                Some(_) if vis.ranges.is_some() => {
                    let jv = _mm512_set1_epi32(j as i32);
                    let seen = _mm512_cmpge_epi32_mask(jv, lo) & _mm512_cmplt_epi32_mask(jv, hi);
                    _mm512_mask_blend_ps(seen & live, neg_inf, _mm512_setzero_ps())
                }
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
            // SAFETY: row jj < KV_BLOCK of p.
            unsafe { _mm512_storeu_ps(s.p.as_mut_ptr().add(jj * LANES), m) };
            *nj = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(m, neg_inf) != 0;
            if *nj {
                // SAFETY: row (j, hk) of k is inside k, contiguous F16 or F32 (caller).
                unsafe { load_row(k, j, hk, &mut s.k_blk[jj * d..(jj + 1) * d]) };
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
                    unsafe { _mm512_storeu_ps(s.p.as_mut_ptr().add(r * LANES), neg_inf) };
                }
                jj += 4;
                continue;
            }
            let kp = rows.map(|r| s.k_blk[r * d..(r + 1) * d].as_ptr());
            // SAFETY: rows of k_blk hold d values each (stale rows are never used); q_t
            // holds d rows.
            let dots = unsafe { lane_dots4(&s.q_t, kp, d) };
            for (r, dot) in dots.iter().enumerate().take(nb - jj) {
                let row = jj + r;
                // SAFETY: row < KV_BLOCK of p (holding the mask).
                unsafe {
                    let pp = s.p.as_mut_ptr().add(row * LANES);
                    let score = if need[row] {
                        _mm512_add_ps(
                            _mm512_mul_ps(*dot, _mm512_set1_ps(io.scale)),
                            _mm512_loadu_ps(pp),
                        )
                    } else {
                        neg_inf
                    };
                    _mm512_storeu_ps(pp, score);
                    blk_max = _mm512_max_ps(blk_max, score);
                }
            }
            jj += 4;
        }
        let upd = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(blk_max, neg_inf) & live;
        if upd == 0 {
            j0 += nb;
            continue;
        }
        let new_max = _mm512_mask_max_ps(max, upd, max, blk_max);
        let grew = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(upd, new_max, max);
        if grew != 0 {
            // SAFETY: AVX-512F is enabled here.
            let e = unsafe { vexp::exp16(_mm512_sub_ps(max, new_max)) };
            let ms = _mm512_mask_mov_ps(_mm512_set1_ps(1.0), grew, e);
            sum = _mm512_mul_ps(sum, ms);
            for c in 0..dv {
                // SAFETY: row c < dv of acc ([dv][16]).
                unsafe {
                    let p = s.acc.as_mut_ptr().add(c * LANES);
                    _mm512_storeu_ps(p, _mm512_mul_ps(_mm512_loadu_ps(p), ms));
                }
            }
        }
        max = new_max;
        let mut psum = _mm512_setzero_ps();
        for jj in 0..nb {
            // SAFETY: row jj of p; AVX-512F is enabled here.
            unsafe {
                let pp = s.p.as_mut_ptr().add(jj * LANES);
                let e = vexp::exp16(_mm512_sub_ps(_mm512_loadu_ps(pp), max));
                // Lanes without a finite score in this block (and masked entries, exp(−∞))
                // weigh nothing.
                let e = _mm512_maskz_mov_ps(upd, e);
                _mm512_storeu_ps(pp, e);
                psum = _mm512_add_ps(psum, e);
            }
            // SAFETY: row (j0 + jj, hk) of v is inside v, contiguous F16 or F32 (caller).
            unsafe { load_row(v, j0 + jj, hk, &mut s.v_blk[jj * dv..(jj + 1) * dv]) };
        }
        sum = _mm512_add_ps(sum, psum);
        // acc[c] += Σ_jj p[jj] · v[jj][c], eight value columns at a time in registers.
        let mut c = 0;
        while c < dv {
            // SAFETY: rows c..c+8 (or c) of acc, rows jj < nb of p and v_blk (dv values each).
            unsafe {
                if c + 8 <= dv {
                    accumulate::<8>(&mut s.acc, &s.p, &s.v_blk, dv, nb, c);
                    c += 8;
                } else {
                    accumulate::<1>(&mut s.acc, &s.p, &s.v_blk, dv, nb, c);
                    c += 1;
                }
            }
        }
        j0 += nb;
    }
    let mut sums = [0f32; LANES];
    // SAFETY: 16 f32s.
    unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), sum) };
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
    unreachable!("attend_blocked is only offered where AVX-512 is available");
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
/// AVX-512F; the mask is F32 with contiguous rows; row `i` of every lane holds `n_kv` values
/// (fewer than 2³¹).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn visibility(m: &RawTensor, lanes: &[(usize, usize)], n_kv: usize) -> Visibility {
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    let zero = _mm512_setzero_ps();
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
                    let k: __mmask16 = if w == 16 { 0xFFFF } else { (1u16 << w) - 1 };
                    // SAFETY: values j..j + w of the row (caller).
                    let x = unsafe { _mm512_maskz_loadu_ps(k, row.add(j)) };
                    let vis = _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(k, x, neg_inf);
                    if vis != 0 {
                        f = f.min(j + vis.trailing_zeros() as usize);
                        la = j + 16 - vis.leading_zeros() as usize;
                        count += vis.count_ones() as usize;
                        if _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(vis, x, zero) != 0 {
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
/// AVX-512F + F16C; the row exists and holds `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn load_row(t: &RawTensor, j: usize, hk: usize, out: &mut [f32]) {
    if t.layout.dtype == tinynn_format::GgmlType::F32 {
        // SAFETY: the row holds out.len() contiguous f32s (caller).
        let row = unsafe { std::slice::from_raw_parts(t.row_f32_ptr(j, hk, 0), out.len()) };
        out.copy_from_slice(row);
    } else {
        // SAFETY: the row holds out.len() contiguous f16s (caller).
        unsafe { f16_row_to_f32(t.row(j, hk, 0).as_ptr(), out) };
    }
}

/// 16 lane scores `Σ_c q_t[c][l] · k[c]` over 8 accumulators (the attention gradient's
/// one-row form).
///
/// # Safety
/// AVX-512F; `q_t` holds `d` rows of 16, `k` holds `d` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn lane_dots(q_t: &[f32], k: &[f32], d: usize) -> __m512 {
    let mut a = [_mm512_setzero_ps(); 8];
    let mut c = 0;
    while c + 8 <= d {
        for (r, ar) in a.iter_mut().enumerate() {
            // SAFETY: c + r < d.
            let qv = unsafe { _mm512_loadu_ps(q_t.as_ptr().add((c + r) * LANES)) };
            *ar = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[c + r]), *ar);
        }
        c += 8;
    }
    while c < d {
        // SAFETY: c < d.
        let qv = unsafe { _mm512_loadu_ps(q_t.as_ptr().add(c * LANES)) };
        a[c % 8] = _mm512_fmadd_ps(qv, _mm512_set1_ps(k[c]), a[c % 8]);
        c += 1;
    }
    let a4 = [0, 1, 2, 3].map(|r| _mm512_add_ps(a[r], a[r + 4]));
    _mm512_add_ps(_mm512_add_ps(a4[0], a4[1]), _mm512_add_ps(a4[2], a4[3]))
}

/// Lane dots of four rows at once: `Σ_c t[c][l] · rows[r][c]` for r < 4, two accumulators
/// each (even and odd c), so each transposed vector loaded feeds four FMAs (the query tiles'
/// scores here; scores and dO·v in the gradient).
///
/// # Safety
/// AVX-512F; `t` holds `d` rows of 16, each row pointer `d` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
pub(crate) unsafe fn lane_dots4(t: &[f32], rows: [*const f32; 4], d: usize) -> [__m512; 4] {
    let mut a = [[_mm512_setzero_ps(); 2]; 4];
    let mut c = 0;
    while c + 2 <= d {
        // SAFETY: c + 1 < d rows of t and values of each row.
        unsafe {
            let t0 = _mm512_loadu_ps(t.as_ptr().add(c * LANES));
            let t1 = _mm512_loadu_ps(t.as_ptr().add((c + 1) * LANES));
            for (ar, &row) in a.iter_mut().zip(&rows) {
                ar[0] = _mm512_fmadd_ps(t0, _mm512_set1_ps(*row.add(c)), ar[0]);
                ar[1] = _mm512_fmadd_ps(t1, _mm512_set1_ps(*row.add(c + 1)), ar[1]);
            }
        }
        c += 2;
    }
    if c < d {
        // SAFETY: c < d.
        unsafe {
            let t0 = _mm512_loadu_ps(t.as_ptr().add(c * LANES));
            for (ar, &row) in a.iter_mut().zip(&rows) {
                ar[0] = _mm512_fmadd_ps(t0, _mm512_set1_ps(*row.add(c)), ar[0]);
            }
        }
    }
    a.map(|ar| _mm512_add_ps(ar[0], ar[1]))
}

/// `acc[c + r] += Σ_jj p[jj] · v_blk[jj][c + r]` for `r < W` (W a constant, so the sums
/// stay in registers).
///
/// # Safety
/// AVX-512F; the rows exist (see the caller).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate<const W: usize>(
    acc: &mut [f32],
    p: &[f32],
    v_blk: &[f32],
    dv: usize,
    nb: usize,
    c: usize,
) {
    let mut r = [_mm512_setzero_ps(); W];
    for (t, rt) in r.iter_mut().enumerate() {
        // SAFETY: row c + t < dv of acc.
        *rt = unsafe { _mm512_loadu_ps(acc.as_ptr().add((c + t) * LANES)) };
    }
    for jj in 0..nb {
        // SAFETY: row jj of p; value (jj, c + t) of v_blk.
        unsafe {
            let pj = _mm512_loadu_ps(p.as_ptr().add(jj * LANES));
            let vrow = v_blk.as_ptr().add(jj * dv + c);
            for (t, rt) in r.iter_mut().enumerate() {
                *rt = _mm512_fmadd_ps(pj, _mm512_set1_ps(*vrow.add(t)), *rt);
            }
        }
    }
    for (t, rt) in r.iter().enumerate() {
        // SAFETY: row c + t < dv of acc.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add((c + t) * LANES), *rt) };
    }
}

/// `out[c] = f32(row[c])` for an F16 row.
///
/// # Safety
/// AVX-512F + F16C; `row` holds `out.len()` f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn f16_row_to_f32(row: *const u8, out: &mut [f32]) {
    let n = out.len();
    let mut c = 0;
    while c + 16 <= n {
        // SAFETY: 16 f16s at row + 2c, 16 f32s at out[c..].
        unsafe {
            let h = _mm256_loadu_si256(row.add(2 * c) as *const __m256i);
            _mm512_storeu_ps(out.as_mut_ptr().add(c), _mm512_cvtph_ps(h));
        }
        c += 16;
    }
    for (x, cc) in out[c..].iter_mut().zip(c..) {
        // SAFETY: f16 cc is inside the row.
        let b = unsafe { [*row.add(2 * cc), *row.add(2 * cc + 1)] };
        *x = tinynn_core::quant::half::f16_to_f32(u16::from_le_bytes(b));
    }
}
