//! Attention over an F16 KV cache for up to 16 (query row, head) lanes that share one KV head,
//! with AVX-512: each KV row is converted to f32 once for all lanes, the 16 scores come out of
//! one vector of FMAs (queries transposed, no horizontal sums), and the online softmax runs
//! lane-parallel. Per lane the arithmetic is ggml's F16 path, as in the one-row kernel: q
//! rounded to f16, the value sum kept in f16 (each rescale and multiply-add rounded), `exp`
//! (correctly rounded, vectorized). A lane's result does not depend on which lanes share its tile, so a prompt run as
//! one batch and token by token give the same numbers.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::vexp;
use crate::kernels::RawTensor;

/// Lanes per tile.
pub(crate) const LANES: usize = 16;
/// Largest head size (the graph builder's limit).
pub(crate) const MAX_D: usize = 512;

/// Whether [`attend_tile`] can run here.
pub(crate) fn available() -> bool {
    super::Isa::detected() >= super::Isa::Avx512Vnni
}

/// Everything a tile reads and writes besides its lanes.
pub(crate) struct TileIo {
    /// F32 `[d, n_q, n_head]` (any strides).
    pub q: RawTensor,
    /// F16 `[d, n_kv, n_head_kv]` with contiguous rows (F32 too on the blocked path).
    pub k: RawTensor,
    /// F16 `[dv, n_kv, n_head_kv]` with contiguous rows (F32 too on the blocked path).
    pub v: RawTensor,
    /// F32 `[n_kv, ≥ n_q]`, added to the scores.
    pub mask: Option<RawTensor>,
    /// F32 `[dv, n_head, n_q]` with contiguous rows.
    pub dst: RawTensor,
    pub n_kv: usize,
    pub scale: f32,
}

/// Scratch for one tile (about 68 KiB; one per thread).
pub(crate) struct TileScratch {
    /// Queries transposed: `[d][16]`.
    pub(super) q_t: Vec<f32>,
    /// Value sums: `[16][dv]` (f16 path) or `[dv][16]` (blocked f32 path).
    pub(super) acc: Vec<f32>,
    pub(super) k_row: Vec<f32>,
    pub(super) v_row: Vec<f32>,
    /// Blocked path: scores, then probabilities, `[KV_BLOCK][16]`.
    pub(super) p: Vec<f32>,
    /// Blocked path: the block's value rows in f32, `[KV_BLOCK][dv]`.
    pub(super) v_blk: Vec<f32>,
}

impl TileScratch {
    pub(crate) fn new() -> TileScratch {
        TileScratch {
            q_t: vec![0.0; MAX_D * LANES],
            acc: vec![0.0; LANES * MAX_D],
            k_row: vec![0.0; MAX_D],
            v_row: vec![0.0; MAX_D],
            p: vec![0.0; super::attention_block::KV_BLOCK * LANES],
            v_blk: vec![0.0; super::attention_block::KV_BLOCK * MAX_D],
        }
    }
}

/// Attention for `lanes` (query row `i`, head `h`; all heads of KV head `hk`), 1 to 16 of them.
///
/// # Safety
/// [`available`]; the tensors are as documented on [`TileIo`] and in bounds for the lanes and
/// `n_kv`; the lanes' output rows belong to this thread.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")]
pub(crate) unsafe fn attend_tile(
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
    // Queries transposed and rounded to f16: q_t[c·16 + l]. Lanes past `n` keep whatever
    // they hold: their scores are never used (`live` masks them everywhere).
    for (l, &(i, h)) in lanes.iter().enumerate() {
        for c in 0..d {
            // SAFETY: (c, i, h) is inside q (caller).
            let x = unsafe { q.f32_at([c, i, h, 0]) };
            s.q_t[c * LANES + l] = round16(x);
        }
    }
    s.acc[..n * dv].fill(0.0);
    // Mask element (j, i_l) sits at index idx_l + j (F32, so nb0 = 4).
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
    let (mut ms_a, mut vs_a) = ([0f32; LANES], [0f32; LANES]);
    for j in 0..io.n_kv {
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
            continue;
        }
        // SAFETY: row (j, hk) of k and v are inside them, contiguous F16 (caller).
        unsafe {
            f16_row_to_f32(k.row(j, hk, 0).as_ptr(), &mut s.k_row[..d]);
        }
        let mut a = [_mm512_setzero_ps(); 8];
        let mut c = 0;
        while c + 8 <= d {
            for (r, ar) in a.iter_mut().enumerate() {
                // SAFETY: c + r < d ≤ MAX_D rows of q_t.
                let qv = unsafe { _mm512_loadu_ps(s.q_t.as_ptr().add((c + r) * LANES)) };
                *ar = _mm512_fmadd_ps(qv, _mm512_set1_ps(s.k_row[c + r]), *ar);
            }
            c += 8;
        }
        while c < d {
            // SAFETY: c < d.
            let qv = unsafe { _mm512_loadu_ps(s.q_t.as_ptr().add(c * LANES)) };
            a[c % 8] = _mm512_fmadd_ps(qv, _mm512_set1_ps(s.k_row[c]), a[c % 8]);
            c += 1;
        }
        let a4 = [0, 1, 2, 3].map(|r| _mm512_add_ps(a[r], a[r + 4]));
        let score = _mm512_add_ps(_mm512_add_ps(a4[0], a4[1]), _mm512_add_ps(a4[2], a4[3]));
        let score = _mm512_add_ps(_mm512_mul_ps(score, _mm512_set1_ps(io.scale)), m);
        let valid = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(score, neg_inf) & live;
        if valid == 0 {
            continue;
        }
        let gt = _mm512_mask_cmp_ps_mask::<_CMP_GT_OQ>(valid, score, max);
        // ms = exp(max − s) where s is a new maximum, else 1; vs = 1 there, exp(s − max) on
        // the other valid lanes, 0 on the rest.
        let arg = _mm512_mask_sub_ps(_mm512_sub_ps(score, max), gt, max, score);
        // SAFETY: AVX-512F is enabled here.
        let e = unsafe { vexp::exp16(arg) };
        let one = _mm512_set1_ps(1.0);
        let ms = _mm512_mask_mov_ps(one, gt, e);
        let vs = _mm512_mask_mov_ps(_mm512_maskz_mov_ps(valid, e), gt, one);
        // SAFETY: 16 f32s each.
        unsafe {
            _mm512_storeu_ps(ms_a.as_mut_ptr(), ms);
            _mm512_storeu_ps(vs_a.as_mut_ptr(), vs);
        }
        sum = _mm512_mask_add_ps(sum, valid, _mm512_mul_ps(sum, ms), vs);
        max = _mm512_mask_mov_ps(max, gt, score);
        // SAFETY: row (j, hk) of v is inside v (caller).
        unsafe {
            f16_row_to_f32(v.row(j, hk, 0).as_ptr(), &mut s.v_row[..dv]);
        }
        for l in 0..n {
            if valid & (1u16 << l) == 0 {
                continue;
            }
            let acc = &mut s.acc[l * dv..(l + 1) * dv];
            if ms_a[l] != 1.0 {
                scale_rounded(acc, ms_a[l]);
            }
            mad_rounded(acc, &s.v_row[..dv], vs_a[l]);
        }
    }
    let mut sums = [0f32; LANES];
    // SAFETY: 16 f32s.
    unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), sum) };
    for (l, &(i, h)) in lanes.iter().enumerate() {
        let inv = if sums[l] > 0.0 { 1.0 / sums[l] } else { 0.0 };
        let out = io.dst.row_f32_ptr(h, i, 0);
        for (c, &x) in s.acc[l * dv..(l + 1) * dv].iter().enumerate() {
            // SAFETY: output row (h, i) is [dv] contiguous and this thread's (caller).
            unsafe { out.add(c).write(x * inv) };
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn attend_tile(_: &TileIo, _: usize, _: &[(usize, usize)], _: &mut TileScratch) {
    unreachable!("attend_tile is only offered where `available()` is true");
}

#[inline]
pub(super) fn round16(x: f32) -> f32 {
    use tinynn_core::quant::half;
    half::f16_to_f32(half::f32_to_f16(x))
}

/// `out[c] = f32(row[c])` for an F16 row.
///
/// # Safety
/// AVX-512F + F16C; `row` holds `out.len()` f16 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
pub(super) unsafe fn f16_row_to_f32(row: *const u8, out: &mut [f32]) {
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

/// `acc = f16(acc · s)`, element-wise.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn scale_rounded(acc: &mut [f32], s: f32) {
    let (n, sv) = (acc.len(), _mm512_set1_ps(s));
    let mut c = 0;
    while c + 16 <= n {
        // SAFETY: 16 f32s at acc[c..].
        unsafe {
            let p = acc.as_mut_ptr().add(c);
            let r = _mm512_mul_ps(_mm512_loadu_ps(p), sv);
            let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            _mm512_storeu_ps(p, r);
        }
        c += 16;
    }
    for x in acc[c..].iter_mut() {
        *x = round16(*x * s);
    }
}

/// `acc = f16(acc + v · s)`, element-wise (one f32 FMA, then rounded to f16).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c,fma")]
unsafe fn mad_rounded(acc: &mut [f32], v: &[f32], s: f32) {
    let (n, sv) = (acc.len(), _mm512_set1_ps(s));
    let mut c = 0;
    while c + 16 <= n {
        // SAFETY: 16 f32s at acc[c..] and v[c..].
        unsafe {
            let p = acc.as_mut_ptr().add(c);
            let r = _mm512_fmadd_ps(_mm512_loadu_ps(v.as_ptr().add(c)), sv, _mm512_loadu_ps(p));
            let r = _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r));
            _mm512_storeu_ps(p, r);
        }
        c += 16;
    }
    for (x, &y) in acc[c..].iter_mut().zip(&v[c..]) {
        *x = round16(y.mul_add(s, *x));
    }
}
