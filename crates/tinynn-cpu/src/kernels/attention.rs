//! Fused attention (online softmax over the kv rows, one query row and head at a time) and
//! causal masking.

use tinynn_format::GgmlType;

use super::{row_index, split, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;
use crate::simd::attention_block::{self, TileIo, TileScratch, LANES};
use crate::simd::attention_f16::{self, HeadsState, KvRows};
use crate::simd::quantize_q8::round_to_f16;

#[path = "attention_split.rs"]
mod split;
pub(crate) use split::split_work_bytes;
use split::{attend_split_kv, split_kv};

/// Query rows from which a batch uses the blocked f32 attention (llama.cpp's CPU backend
/// switches to its tiled f32 path at the same size); smaller batches and decode keep ggml's
/// one-row f16 arithmetic, which greedy parity with llama.cpp depends on.
const BLOCKED_MIN_ROWS: usize = 64;

/// Largest head size kept on the stack (the builder enforces it).
const MAX_D: usize = 512;

pub(crate) fn flash_attn(
    scale: f32,
    softcap: f32,
    has_mask: bool,
    has_kv_len: bool,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let k = a.src(1);
    let mut next = 3;
    let mask = has_mask.then(|| {
        next += 1;
        a.src(next - 1)
    });
    let n_kv_all = k.layout.ne[1];
    let n_kv = if has_kv_len {
        // SAFETY: an I32 [1] tensor (builder-checked).
        let n = unsafe { a.src(next).i32s() }[0];
        if n < 0 || n as usize > n_kv_all {
            a.errors.record(ERR_KERNEL, 0);
            return;
        }
        n as usize
    } else {
        n_kv_all
    };
    if a.strict {
        attend::<f64>(scale, softcap, mask, n_kv, a, ctx);
    } else if a.src(2).layout.dtype == GgmlType::F16 && k.layout.dtype == GgmlType::F16 {
        let prompt = a.src(0).layout.ne[1] >= BLOCKED_MIN_ROWS;
        if prompt && softcap == 0.0 && attention_block::available() && tile_fits(mask.as_ref(), a) {
            attend_blocked(scale, mask, n_kv, a, ctx);
        } else {
            attend_f16_cache(scale, softcap, mask, n_kv, a, ctx);
        }
    } else if softcap == 0.0
        && attention_block::available()
        && [k, a.src(2)]
            .iter()
            .all(|t| t.layout.dtype == GgmlType::F32 && t.layout.nb[0] == 4)
        && tile_fits(mask.as_ref(), a)
    {
        // F32 K/V (training): the blocked f32 arithmetic whatever the batch size.
        attend_blocked(scale, mask, n_kv, a, ctx);
    } else {
        attend::<f32>(scale, softcap, mask, n_kv, a, ctx);
    }
}

/// Whether the blocked kernel takes this call: an F32 mask whose element offsets fit in i32
/// (gathers), contiguous output rows.
fn tile_fits(mask: Option<&super::RawTensor>, a: &StepArgs<'_>) -> bool {
    let mask_ok = mask.is_none_or(|m| {
        m.layout.dtype == GgmlType::F32
            && m.layout.nb[0] == 4
            && m.layout.ne[1] * m.layout.nb[1] < i32::MAX as usize / 2
    });
    mask_ok && a.dst.layout.nb[0] == 4 && a.dst.layout.dtype == GgmlType::F32
}

thread_local! {
    /// Each pool thread's tile scratch, made on its first attention step.
    static SCRATCH: std::cell::RefCell<TileScratch> = std::cell::RefCell::new(TileScratch::new());
}

/// Blocked f32 attention (`simd::attention_block`) for prompts over the F16 cache and for
/// training's F32 K/V at any batch size, 16 (query, head) lanes of one KV head at a time.
/// Tiles go round-robin to the threads, so causal prompts (later rows attend to more) split
/// evenly.
fn attend_blocked(
    scale: f32,
    mask: Option<super::RawTensor>,
    n_kv: usize,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (q, k, v) = (a.src(0), a.src(1), a.src(2));
    let (n_q, n_head, n_head_kv) = (q.layout.ne[1], q.layout.ne[2], k.layout.ne[2]);
    let group = n_head / n_head_kv;
    let per_kv_head = (n_q * group).div_ceil(LANES);
    let io = TileIo {
        q,
        k,
        v,
        mask,
        dst: a.dst,
        n_kv,
        scale,
    };
    SCRATCH.with_borrow_mut(|scratch| {
        let mut lanes = [(0usize, 0usize); LANES];
        for job in (ctx.ith..n_head_kv * per_kv_head).step_by(ctx.nth) {
            let (hk, t) = (job / per_kv_head, job % per_kv_head);
            let pairs = t * LANES..((t + 1) * LANES).min(n_q * group);
            let n = pairs.len();
            for (lane, p) in lanes.iter_mut().zip(pairs) {
                *lane = (p / group, hk * group + p % group);
            }
            // SAFETY: available() was checked by the caller; the builder checked the shapes
            // (q [d, n_q, H], k/v F16/F32 [·, n_kv, H_kv] with contiguous rows, mask [n_kv, ≥ n_q]
            // F32, dst [dv, H, n_q] contiguous rows); n_kv ≤ the cache length; each (i, h) lane
            // belongs to exactly one job, so its output row is this thread's.
            unsafe { attention_block::attend_blocked(&io, hk, &lanes[..n], scratch) };
        }
    });
}

/// Attention over an F16 cache with ggml's rounding: q rounded to f16, scores as f16·f16
/// products, and the value sum kept in f16 (each multiply-add and each rescale rounded), the
/// way llama.cpp's CPU flash attention computes it. This is what makes greedy output match
/// llama.cpp where two tokens are within a few thousandths.
fn attend_f16_cache(
    scale: f32,
    softcap: f32,
    mask: Option<super::RawTensor>,
    n_kv: usize,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (q, n_head, n_head_kv) = (a.src(0), a.src(0).layout.ne[2], a.src(1).layout.ne[2]);
    let group = n_head / n_head_kv;
    // q·k as ggml does it: q converted to f16, then the F16 dot kernel.
    let Some(dot) = crate::simd::dot_fn(GgmlType::F16) else {
        a.errors.record(ERR_KERNEL, 0);
        return;
    };
    let call = AttendCall {
        scale,
        softcap,
        mask: mask.as_ref(),
        n_kv,
        dot,
        group,
    };
    HEADS.with_borrow_mut(|sc| {
        // The mask's contents change between runs: visible rows are kept within this call.
        sc.rows_of = None;
        if split_kv(&call, a) {
            attend_split_kv(&call, a, ctx, sc);
            return;
        }
        let units = q.layout.ne[1] * n_head_kv;
        if a.claimable && units >= 4 * ctx.nth {
            // Whole (query row, kv head) units to whichever thread is free: a thread that a
            // busy sibling core slows takes fewer (a static split left one thread ~40%
            // behind the other in 4-sequence decode).
            while let Some(claimed) = a.claim(units, 1) {
                for u in claimed {
                    let (i, hk) = (u / n_head_kv, u % n_head_kv);
                    let mut h = hk * group;
                    while h < (hk + 1) * group {
                        let end = (h + MAX_GROUP).min((hk + 1) * group);
                        attend_heads_f16(&call, (i, h..end), ALL, HeadsOut::Rows, a, sc);
                        h = end;
                    }
                }
            }
            return;
        }
        let jobs = split(q.layout.ne[1] * n_head, ctx.ith, ctx.nth);
        let mut job = jobs.start;
        while job < jobs.end {
            // The run of this thread's (row, head) jobs that share row i and kv head h / group.
            let (i, h) = (job / n_head, job % n_head);
            let group_end = i * n_head + (h / group + 1) * group;
            let end = jobs.end.min(group_end).min(job + MAX_GROUP);
            let heads = h..h + (end - job);
            attend_heads_f16(&call, (i, heads), ALL, HeadsOut::Rows, a, sc);
            job = end;
        }
    });
}

/// Every visible row (for [`attend_heads_f16`]).
const ALL: std::ops::Range<usize> = 0..usize::MAX;

/// Query heads handled in one pass over the kv rows (their K and V rows are read once).
const MAX_GROUP: usize = 8;

/// What every (row, heads) job of one [`attend_f16_cache`] call shares.
struct AttendCall<'a> {
    scale: f32,
    softcap: f32,
    mask: Option<&'a super::RawTensor>,
    n_kv: usize,
    dot: crate::simd::DotFn,
    /// Query heads per kv head.
    group: usize,
}

/// Each pool thread's scratch of [`attend_heads_f16`].
#[derive(Default)]
struct HeadScratch {
    /// The queries, `d` a head.
    x: Vec<f32>,
    /// The queries rounded to f16, as f32 and as f16 bytes, `d` a head.
    q: Vec<f32>,
    q16: Vec<u8>,
    /// The value sums, `dv` a head.
    acc: Vec<f32>,
    /// The visible kv rows of query row `rows_of` and their mask values (every kv head of a
    /// row sees the same rows: listed once per row and call).
    rows: Vec<(usize, f32)>,
    rows_of: Option<usize>,
}

thread_local! {
    static HEADS: std::cell::RefCell<HeadScratch> = std::cell::RefCell::new(HeadScratch::default());
}

/// Where [`attend_heads_f16`] puts its results.
#[derive(Clone, Copy)]
enum HeadsOut {
    /// Each head's normalized output row.
    Rows,
    /// Each head's partial state over its kv rows, `[max, sum, values (dv)]` f32s, head `h`'s
    /// at `base + h·stride` ([`attend_split_kv`]).
    Partials { base: *mut f32, stride: usize },
}

/// Lists in `sc.rows` the kv rows query row `i` sees (kept while the same row comes again).
fn visible_rows_of(call: &AttendCall<'_>, i: usize, sc: &mut HeadScratch) {
    if sc.rows_of != Some(i) {
        sc.rows.clear();
        // Mask row i: element j is `step` f32s after element j − 1 (F32, builder-checked).
        let mask_row = call
            .mask
            .map(|m| (m.row_f32_ptr(i, 0, 0) as *const f32, m.layout.nb[0] / 4));
        // SAFETY: the mask is F32 [n_kv, ≥ n_q] (builder-checked), so (j, i) is inside it for
        // every j < n_kv.
        unsafe { attention_f16::visible_rows(mask_row, call.n_kv, &mut sc.rows) };
        sc.rows_of = Some(i);
    }
}

/// [`attend_f16_cache`] for query row `i` and `heads` (at most [`MAX_GROUP`], all of one kv
/// head) over the row's visible kv rows numbered `visible` (in order; `0..usize::MAX`: all):
/// one pass over them, each head's arithmetic exactly as if alone.
fn attend_heads_f16(
    call: &AttendCall<'_>,
    (i, heads): (usize, std::ops::Range<usize>),
    visible: std::ops::Range<usize>,
    out: HeadsOut,
    a: &StepArgs<'_>,
    sc: &mut HeadScratch,
) {
    let (q, k, v) = (a.src(0), a.src(1), a.src(2));
    let (d, dv, n) = (q.layout.ne[0], v.layout.ne[0], heads.len());
    let hk = heads.start / call.group;
    sc.x.clear();
    for h in heads.clone() {
        if q.layout.nb[0] == 4 {
            // SAFETY: row (i, h) of q is d contiguous f32s.
            sc.x.extend_from_slice(unsafe {
                std::slice::from_raw_parts(q.row_f32_ptr(i, h, 0), d)
            });
        } else {
            // SAFETY: (j, i, h) is inside q for every j < d.
            sc.x.extend((0..d).map(|j| unsafe { q.f32_at([j, i, h, 0]) }));
        }
    }
    sc.q.resize(n * d, 0.0);
    sc.q16.resize(2 * n * d, 0);
    round_to_f16(&sc.x, &mut sc.q, &mut sc.q16);
    sc.acc.clear();
    sc.acc.resize(n * dv, 0.0);
    visible_rows_of(call, i, sc);
    // The visible rows numbered `visible` (sc.rows is in row order).
    let (first, end) = (
        visible.start.min(sc.rows.len()),
        visible.end.min(sc.rows.len()),
    );
    let kv = KvRows {
        k: k.row_ptr(0, hk, 0),
        k_stride: k.layout.nb[1],
        v: v.row_ptr(0, hk, 0),
        v_stride: v.layout.nb[1],
        rows: &sc.rows[first..end.max(first)],
        dot: call.dot,
    };
    let (mut max, mut sum) = ([f32::NEG_INFINITY; MAX_GROUP], [0f32; MAX_GROUP]);
    let mut st = HeadsState {
        q: &sc.q,
        q16: &sc.q16,
        acc: &mut sc.acc,
        max: &mut max[..n],
        sum: &mut sum[..n],
    };
    // SAFETY: rows j < n_kv of kv head hk are inside K ([d, ≥ n_kv, kv heads] F16 with
    // contiguous rows, builder-checked) and V (the same with dv).
    unsafe { attention_f16::attend_rows(&kv, &mut st, call.scale, call.softcap) };
    if let HeadsOut::Partials { base, stride } = out {
        for (g, h) in heads.enumerate() {
            // SAFETY: head h's partial, 2 + dv f32s, is inside the work buffer and this
            // thread's (attend_split_kv).
            unsafe {
                let p = base.add(h * stride);
                p.write(max[g]);
                p.add(1).write(sum[g]);
                std::ptr::copy_nonoverlapping(sc.acc[g * dv..].as_ptr(), p.add(2), dv);
            }
        }
        return;
    }
    for (g, h) in heads.enumerate() {
        let inv = if sum[g] > 0.0 { 1.0 / sum[g] } else { 0.0 };
        let out = a.dst.row_f32_ptr(h, i, 0);
        for (c, &x) in sc.acc[g * dv..][..dv].iter().enumerate() {
            // SAFETY: output row (h, i) is [Dv] contiguous and this thread's.
            unsafe { out.add(c).write(x * inv) };
        }
    }
}

/// The accumulator type of attention: f32 normally, f64 in strict mode.
trait Acc:
    Copy
    + PartialOrd
    + std::ops::AddAssign
    + std::ops::MulAssign
    + std::ops::Mul<Output = Self>
    + std::ops::Sub<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INF: Self;
    fn of(x: f32) -> Self;
    fn exp(self) -> Self;
    fn tanh(self) -> Self;
    fn to_f32(self) -> f32;
    fn recip(self) -> Self;
}

macro_rules! acc {
    ($t:ty) => {
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INF: Self = <$t>::NEG_INFINITY;
            #[inline]
            fn of(x: f32) -> Self {
                x as $t
            }
            #[inline]
            fn exp(self) -> Self {
                <$t>::exp(self)
            }
            #[inline]
            fn tanh(self) -> Self {
                <$t>::tanh(self)
            }
            #[inline]
            fn to_f32(self) -> f32 {
                self as f32
            }
            #[inline]
            fn recip(self) -> Self {
                1.0 / self
            }
        }
    };
}
acc!(f32);
acc!(f64);

fn attend<T: Acc>(
    scale: f32,
    softcap: f32,
    mask: Option<super::RawTensor>,
    n_kv: usize,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (q, k, v) = (a.src(0), a.src(1), a.src(2));
    let (d, n_q, n_head) = (q.layout.ne[0], q.layout.ne[1], q.layout.ne[2]);
    let dv = v.layout.ne[0];
    let group = n_head / k.layout.ne[2];
    let (mut qbuf, mut acc) = ([T::ZERO; MAX_D], [T::ZERO; MAX_D]);
    for job in split(n_q * n_head, ctx.ith, ctx.nth) {
        let (h, i) = (job % n_head, job / n_head);
        let hk = h / group;
        for (j, x) in qbuf[..d].iter_mut().enumerate() {
            // SAFETY: (j, i, h) is inside q.
            *x = T::of(unsafe { q.f32_at([j, i, h, 0]) });
        }
        acc[..dv].fill(T::ZERO);
        let (mut max, mut sum) = (T::NEG_INF, T::ZERO);
        for j in 0..n_kv {
            let mut s = T::ZERO;
            for (c, &qc) in qbuf[..d].iter().enumerate() {
                // SAFETY: (c, j, hk) is inside k (j < n_kv ≤ ne1, hk < H_kv).
                s += qc * T::of(unsafe { k.float_at([c, j, hk, 0]) });
            }
            s *= T::of(scale);
            if softcap > 0.0 {
                let cap = T::of(softcap);
                s = cap * (s * cap.recip()).tanh();
            }
            if let Some(m) = mask {
                // SAFETY: the mask is [n_kv, ≥ n_q] (builder-checked).
                s += T::of(unsafe { m.f32_at([j, i, 0, 0]) });
            }
            if s == T::NEG_INF {
                continue;
            }
            let weight = if s > max {
                let shrink = (max - s).exp();
                acc[..dv].iter_mut().for_each(|x| *x *= shrink);
                sum *= shrink;
                max = s;
                T::ONE
            } else {
                (s - max).exp()
            };
            for (c, x) in acc[..dv].iter_mut().enumerate() {
                // SAFETY: (c, j, hk) is inside v.
                *x += weight * T::of(unsafe { v.float_at([c, j, hk, 0]) });
            }
            sum += weight;
        }
        let inv = if sum > T::ZERO { sum.recip() } else { T::ZERO };
        let out = a.dst.row_f32_ptr(h, i, 0);
        for (c, &x) in acc[..dv].iter().enumerate() {
            // SAFETY: output row (h, i) is [Dv] contiguous and this thread's.
            unsafe { out.add(c).write((x * inv).to_f32()) };
        }
    }
}

pub(crate) fn diag_mask_inf(n_past: usize, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let dst = a.dst;
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        let (inp, out) = (x.row_f32_ptr(i1, i2, i3), dst.row_f32_ptr(i1, i2, i3));
        for i0 in 0..dst.layout.ne[0] {
            // SAFETY: i0 < ne0 in both rows (contiguous F32, builder-checked); this thread's row;
            // in place, each element is read before it is written.
            unsafe {
                let v = if i0 > n_past + i1 {
                    f32::NEG_INFINITY
                } else {
                    inp.add(i0).read()
                };
                out.add(i0).write(v);
            }
        }
    }
}
