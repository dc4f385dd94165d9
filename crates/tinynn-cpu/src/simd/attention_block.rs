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
use super::attention_tile::f16_row_to_f32;
use super::attention_tile::{TileIo, TileScratch, LANES, MAX_D};
#[cfg(target_arch = "x86_64")]
use super::vexp;

/// KV rows per block.
pub(crate) const KV_BLOCK: usize = 64;

/// Blocked f32 attention for `lanes` (query row `i`, head `h`; all heads of KV head `hk`).
///
/// # Safety
/// As `attention_tile::attend_tile`.
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
    for (l, &(i, h)) in lanes.iter().enumerate() {
        for c in 0..d {
            // SAFETY: (c, i, h) is inside q (caller).
            s.q_t[c * LANES + l] = unsafe { q.f32_at([c, i, h, 0]) };
        }
    }
    s.acc[..dv * LANES].fill(0.0);
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
    let mut j0 = 0;
    while j0 < io.n_kv {
        let nb = KV_BLOCK.min(io.n_kv - j0);
        // Scores of the block, [nb][16]; rows every lane masks stay −∞.
        let mut blk_max = neg_inf;
        for jj in 0..nb {
            let j = j0 + jj;
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
            let score = if _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(m, neg_inf) == 0 {
                neg_inf
            } else {
                // SAFETY: row (j, hk) of k is inside k, contiguous F16 or F32 (caller).
                unsafe { load_row(k, j, hk, &mut s.k_row[..d]) };
                // SAFETY: d ≤ MAX_D rows of q_t and values of k_row.
                let dot = unsafe { lane_dots(&s.q_t, &s.k_row, d) };
                _mm512_add_ps(_mm512_mul_ps(dot, _mm512_set1_ps(io.scale)), m)
            };
            // SAFETY: row jj < KV_BLOCK of p.
            unsafe { _mm512_storeu_ps(s.p.as_mut_ptr().add(jj * LANES), score) };
            blk_max = _mm512_max_ps(blk_max, score);
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
            let w = (dv - c).min(8);
            // SAFETY: rows c..c+w of acc, rows jj < nb of p and v_blk (dv values each).
            unsafe { accumulate(&mut s.acc, &s.p, &s.v_blk, dv, nb, c, w) };
            c += w;
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

/// Row `(j, hk)` of an F16 or F32 tensor with contiguous rows, as f32.
///
/// # Safety
/// AVX-512F + F16C; the row exists and holds `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn load_row(t: &crate::kernels::RawTensor, j: usize, hk: usize, out: &mut [f32]) {
    if t.layout.dtype == tinynn_format::GgmlType::F32 {
        // SAFETY: the row holds out.len() contiguous f32s (caller).
        let row = unsafe { std::slice::from_raw_parts(t.row_f32_ptr(j, hk, 0), out.len()) };
        out.copy_from_slice(row);
    } else {
        // SAFETY: the row holds out.len() contiguous f16s (caller).
        unsafe { f16_row_to_f32(t.row(j, hk, 0).as_ptr(), out) };
    }
}

/// 16 lane scores `Σ_c q_t[c][l] · k[c]` over 8 accumulators.
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

/// `acc[c + r] += Σ_jj p[jj] · v_blk[jj][c + r]` for `r < w ≤ 8`.
///
/// # Safety
/// AVX-512F; the rows exist (see the caller).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn accumulate(
    acc: &mut [f32],
    p: &[f32],
    v_blk: &[f32],
    dv: usize,
    nb: usize,
    c: usize,
    w: usize,
) {
    let mut r = [_mm512_setzero_ps(); 8];
    for (t, rt) in r.iter_mut().enumerate().take(w) {
        // SAFETY: row c + t < dv of acc.
        *rt = unsafe { _mm512_loadu_ps(acc.as_ptr().add((c + t) * LANES)) };
    }
    for jj in 0..nb {
        // SAFETY: row jj of p; value (jj, c + t) of v_blk.
        unsafe {
            let pj = _mm512_loadu_ps(p.as_ptr().add(jj * LANES));
            let vrow = v_blk.as_ptr().add(jj * dv + c);
            for (t, rt) in r.iter_mut().enumerate().take(w) {
                *rt = _mm512_fmadd_ps(pj, _mm512_set1_ps(*vrow.add(t)), *rt);
            }
        }
    }
    for (t, rt) in r.iter().enumerate().take(w) {
        // SAFETY: row c + t < dv of acc.
        unsafe { _mm512_storeu_ps(acc.as_mut_ptr().add((c + t) * LANES), *rt) };
    }
}
