//! Gradient of fused attention. Nothing is saved by the forward pass: the attention rows are
//! recomputed from q, k, v (f64 sums).
//!
//! Phase 1, per (head, query) row: the log-sum-exp of the scores, `D = dO·O`, and dq. Both
//! scalars go to the work buffer. Phase 2 (after a barrier), per (kv head, kv row): dk and dv,
//! summing over the query heads of the group and the queries in a fixed order. Every output
//! row is written by one thread, so results do not depend on the thread count.

use tinynn_format::GgmlType;

use super::{split, RawTensor, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;
use crate::simd::attention_back::{self as tiles, BackIo, BackScratch};
use crate::simd::attention_block::{self, LANES};

thread_local! {
    /// Each pool thread's scratch for the SIMD tiles, made on its first use.
    static SCRATCH: std::cell::RefCell<BackScratch> = std::cell::RefCell::new(BackScratch::new());
}

/// Largest head size (the forward builder enforces it).
const MAX_D: usize = 512;

struct Attn {
    q: RawTensor,
    k: RawTensor,
    v: RawTensor,
    mask: Option<RawTensor>,
    d_out: RawTensor,
    scale: f64,
    softcap: f64,
}

impl Attn {
    /// `(s, ds/draw)`: the masked score of query i (q loaded in `qbuf`) and kv row j of kv head hk, and the
    /// derivative of the capped score by the uncapped one. `s` is -inf where masked.
    fn score(&self, i: usize, hk: usize, j: usize, qbuf: &[f64]) -> (f64, f64) {
        // SAFETY: the mask is [n_kv, ≥ n_q] (builder-checked).
        let m = self
            .mask
            .map_or(0.0, |m| f64::from(unsafe { m.f32_at([j, i, 0, 0]) }));
        if m == f64::NEG_INFINITY {
            return (m, 0.0);
        }
        let mut raw = 0f64;
        for (c, &qc) in qbuf.iter().enumerate() {
            // SAFETY: (c, j, hk) is inside k.
            raw += qc * f64::from(unsafe { self.k.f32_at([c, j, hk, 0]) });
        }
        raw *= self.scale;
        if self.softcap > 0.0 {
            let t = (raw / self.softcap).tanh();
            (self.softcap * t + m, 1.0 - t * t)
        } else {
            (raw + m, 1.0)
        }
    }

    /// `dO[h, i] · v[j, hk]`.
    fn dp(&self, h: usize, i: usize, hk: usize, j: usize) -> f64 {
        (0..self.v.layout.ne[0])
            .map(|c| {
                // SAFETY: (c, h, i) is inside dO, (c, j, hk) inside v.
                unsafe {
                    f64::from(self.d_out.f32_at([c, h, i, 0]))
                        * f64::from(self.v.f32_at([c, j, hk, 0]))
                }
            })
            .sum()
    }

    fn load_q(&self, h: usize, i: usize, qbuf: &mut [f64]) {
        for (c, x) in qbuf.iter_mut().enumerate() {
            // SAFETY: (c, i, h) is inside q.
            *x = f64::from(unsafe { self.q.f32_at([c, i, h, 0]) });
        }
    }
}

/// Whether the SIMD tiles (AVX-512 or AVX2) take this call: every operand F32 with contiguous rows, a mask
/// whose element offsets fit in i32 (gathers).
fn tiles_fit(at: &Attn) -> bool {
    let f32_rows = |t: &RawTensor| t.layout.dtype == GgmlType::F32 && t.layout.nb[0] == 4;
    attention_block::available()
        && [&at.q, &at.k, &at.v, &at.d_out].into_iter().all(f32_rows)
        && at
            .mask
            .as_ref()
            .is_none_or(|m| f32_rows(m) && m.layout.ne[1] * m.layout.nb[1] < i32::MAX as usize / 2)
}

/// The SIMD path (`simd::attention_back`): query tiles (16 (query, head) pairs of a KV
/// head) round-robin over the threads, a barrier, then KV tiles (16 KV rows of a KV head).
fn back_tiled(io: &BackIo, group: usize, ctx: &Ctx<'_>) {
    let (n_q, n_kv, n_head_kv) = (io.q.layout.ne[1], io.k.layout.ne[1], io.k.layout.ne[2]);
    let per_kv_head = (n_q * group).div_ceil(LANES);
    SCRATCH.with_borrow_mut(|scratch| {
        let mut lanes = [(0usize, 0usize); LANES];
        for job in (ctx.ith..n_head_kv * per_kv_head).step_by(ctx.nth) {
            let (hk, t) = (job / per_kv_head, job % per_kv_head);
            let pairs = t * LANES..((t + 1) * LANES).min(n_q * group);
            let n = pairs.len();
            for (lane, p) in lanes.iter_mut().zip(pairs) {
                *lane = (p / group, hk * group + p % group);
            }
            // SAFETY: tiles_fit() checked the ISA and layouts, the caller the head sizes and
            // the work buffer; each (i, h) lane belongs to exactly one job, so its dq row and
            // stats slot are this thread's.
            unsafe { tiles::query_tile(io, hk, &lanes[..n], scratch) };
        }
        if ctx.barrier().is_err() {
            return;
        }
        let per_kv_head = n_kv.div_ceil(LANES);
        for job in (ctx.ith..n_head_kv * per_kv_head).step_by(ctx.nth) {
            let (hk, t) = (job / per_kv_head, job % per_kv_head);
            let j0 = t * LANES;
            let n = LANES.min(n_kv - j0);
            // SAFETY: as above; every stats slot was written before the barrier; KV rows
            // j0..j0+n of head hk belong to this job alone.
            unsafe { tiles::kv_tile(io, hk, j0, n, group, scratch) };
        }
    });
}

/// `offsets`: where dk and dv start in the output, in elements from dq (one batch of a batched
/// op); `None`: right after dq and dk.
pub(crate) fn flash_attn_back(
    scale: f32,
    softcap: f32,
    has_mask: bool,
    offsets: Option<[usize; 2]>,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let at = Attn {
        q: a.src(0),
        k: a.src(1),
        v: a.src(2),
        mask: has_mask.then(|| a.src(3)),
        d_out: a.src(if has_mask { 4 } else { 3 }),
        scale: f64::from(scale),
        softcap: f64::from(softcap),
    };
    let (d, n_q, n_head) = (at.q.layout.ne[0], at.q.layout.ne[1], at.q.layout.ne[2]);
    let (n_kv, n_head_kv, dv) = (at.k.layout.ne[1], at.k.layout.ne[2], at.v.layout.ne[0]);
    let group = n_head / n_head_kv;
    let stats = a.work as *mut f64;
    if a.work_len < 16 * n_q * n_head || d > MAX_D || dv > MAX_D {
        a.errors.record(ERR_KERNEL, 0);
        return;
    }
    let out = a.dst.ptr as *mut f32;
    let (dq_at, [dk_at, dv_at]) = (
        0,
        offsets.unwrap_or([
            at.q.layout.n_elements(),
            at.q.layout.n_elements() + at.k.layout.n_elements(),
        ]),
    );
    if !a.strict && softcap == 0.0 && tiles_fit(&at) {
        let io = BackIo {
            q: at.q,
            k: at.k,
            v: at.v,
            mask: at.mask,
            d_out: at.d_out,
            scale,
            out,
            dk_at,
            dv_at,
            stats,
        };
        return back_tiled(&io, group, ctx);
    }
    let mut qbuf = [0f64; MAX_D];
    let mut acc = [0f64; MAX_D];
    let mut acc2 = [0f64; MAX_D];

    // Phase 1: per (h, i): lse, D = dO·O, and dq.
    for job in split(n_q * n_head, ctx.ith, ctx.nth) {
        let (h, i) = (job % n_head, job / n_head);
        let hk = h / group;
        at.load_q(h, i, &mut qbuf[..d]);
        let (mut max, mut sum) = (f64::NEG_INFINITY, 0f64);
        let o = &mut acc[..dv];
        o.fill(0.0);
        for j in 0..n_kv {
            let (s, _) = at.score(i, hk, j, &qbuf[..d]);
            if s == f64::NEG_INFINITY {
                continue;
            }
            let w = if s > max {
                let shrink = (max - s).exp();
                o.iter_mut().for_each(|x| *x *= shrink);
                sum *= shrink;
                max = s;
                1.0
            } else {
                (s - max).exp()
            };
            for (c, x) in o.iter_mut().enumerate() {
                // SAFETY: (c, j, hk) is inside v.
                *x += w * f64::from(unsafe { at.v.f32_at([c, j, hk, 0]) });
            }
            sum += w;
        }
        let (lse, dsum) = if sum > 0.0 {
            let dsum: f64 = o
                .iter()
                .enumerate()
                // SAFETY: (c, h, i) is inside dO.
                .map(|(c, &x)| x / sum * f64::from(unsafe { at.d_out.f32_at([c, h, i, 0]) }))
                .sum();
            (max + sum.ln(), dsum)
        } else {
            (f64::INFINITY, 0.0)
        };
        let dq = &mut acc2[..d];
        dq.fill(0.0);
        if sum > 0.0 {
            for j in 0..n_kv {
                let (s, dcap) = at.score(i, hk, j, &qbuf[..d]);
                if s == f64::NEG_INFINITY {
                    continue;
                }
                let p = (s - lse).exp();
                let ds = p * (at.dp(h, i, hk, j) - dsum) * dcap * at.scale;
                for (c, x) in dq.iter_mut().enumerate() {
                    // SAFETY: (c, j, hk) is inside k.
                    *x += ds * f64::from(unsafe { at.k.f32_at([c, j, hk, 0]) });
                }
            }
        }
        let row = dq_at + d * (i + n_q * h);
        for (c, &x) in dq.iter().enumerate() {
            // SAFETY: dq row (i, h) is inside the flat output and this thread's; the stats
            // slot of job (h, i) is inside the work buffer (checked above) and this thread's.
            unsafe { out.add(row + c).write(x as f32) };
        }
        // SAFETY: as above.
        unsafe {
            stats.add(2 * job).write(lse);
            stats.add(2 * job + 1).write(dsum);
        }
    }
    if ctx.barrier().is_err() {
        return;
    }

    // Phase 2: per (hk, j): dk and dv over the group's heads and every query.
    for job in split(n_kv * n_head_kv, ctx.ith, ctx.nth) {
        let (j, hk) = (job % n_kv, job / n_kv);
        let (dk, dvv) = (&mut acc[..d], &mut acc2[..dv]);
        dk.fill(0.0);
        dvv.fill(0.0);
        for h in hk * group..(hk + 1) * group {
            for i in 0..n_q {
                let slot = h + n_head * i;
                // SAFETY: written in phase 1, before the barrier.
                let (lse, dsum) =
                    unsafe { (stats.add(2 * slot).read(), stats.add(2 * slot + 1).read()) };
                at.load_q(h, i, &mut qbuf[..d]);
                let (s, dcap) = at.score(i, hk, j, &qbuf[..d]);
                if s == f64::NEG_INFINITY || lse == f64::INFINITY {
                    continue;
                }
                let p = (s - lse).exp();
                let ds = p * (at.dp(h, i, hk, j) - dsum) * dcap * at.scale;
                for (x, &qc) in dk.iter_mut().zip(&qbuf[..d]) {
                    *x += ds * qc;
                }
                for (c, x) in dvv.iter_mut().enumerate() {
                    // SAFETY: (c, h, i) is inside dO.
                    *x += p * f64::from(unsafe { at.d_out.f32_at([c, h, i, 0]) });
                }
            }
        }
        let (rk, rv) = (dk_at + d * (j + n_kv * hk), dv_at + dv * (j + n_kv * hk));
        // SAFETY: dk and dv rows (j, hk) are inside the flat output and this thread's.
        unsafe {
            for (c, &x) in dk.iter().enumerate() {
                out.add(rk + c).write(x as f32);
            }
            for (c, &x) in dvv.iter().enumerate() {
                out.add(rv + c).write(x as f32);
            }
        }
    }
}
