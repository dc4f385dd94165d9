//! One-row attention over a long F16 cache split by kv rows, as llama.cpp's CPU flash
//! attention splits decode once its K view reaches 512 rows. For each query row, its visible
//! rows are numbered in order and padded to a view (rounded up to 256, as llama.cpp's cache
//! view); from 512 the view is cut into `S` equal chunks (`S` = the executor's thread count,
//! as llama.cpp's is its thread count), each chunk runs every head with the one-row f16
//! arithmetic from a fresh state and leaves `[max, sum, values]`, and after a barrier the
//! partials are merged in chunk order (`m = max(m, m_c)`, both sides scaled by `exp(old − m)`)
//! and normalized. A row's chunks depend only on the rows it sees, so a sequence decoded beside
//! others gives what it gives alone; alone (every cached row visible) the chunks are
//! llama.cpp's, but for a view that llama.cpp caps at the cache's end. Chunks go to whichever
//! threads run the step, so the adaptive one-thread fallback gives the same bits.
//!
//! Before, one query row with 9 heads over 3 kv heads gave each of 2 threads one kv head's
//! rows and the middle one's to both; split by rows, each thread reads half of every kv head
//! once. SmolLM2 Q4_1, 2 threads, tg64 at depth 4096 on a contended host (27–47 GB/s), four
//! interleaved rounds: median 54 → 60 t/s.

use super::{
    attend_heads_f16, visible_rows_of, AttendCall, HeadScratch, HeadsOut, StepArgs,
    BLOCKED_MIN_ROWS, MAX_GROUP,
};
use crate::pool::Ctx;

/// The view length (llama.cpp's) from which one query row's attention is split by kv rows.
const SPLIT_MIN_VIEW: usize = 512;

/// llama.cpp's KV cache view: rows in use rounded up to this (at least this many).
const VIEW_PAD: usize = 256;

/// Chunks at most (the plan's work buffer holds this many partials a row and head).
const MAX_KV_SPLITS: usize = 16;

/// Work bytes of the split for a flash-attention node, or 0 when it can never split: fewer
/// than [`BLOCKED_MIN_ROWS`] query rows (`n_q`, `n_head` heads of `dv` values) over an F16
/// cache of `cache_rows` whose view can reach [`SPLIT_MIN_VIEW`] (more than 256 rows): a
/// partial per row, head and chunk.
pub(crate) fn split_work_bytes(n_q: usize, n_head: usize, dv: usize, cache_rows: usize) -> usize {
    if n_q < BLOCKED_MIN_ROWS && chunks(cache_rows, 2).0 > 1 {
        4 * n_q * n_head * MAX_KV_SPLITS * (2 + dv)
    } else {
        0
    }
}

/// Whether this call runs split: fewer than [`BLOCKED_MIN_ROWS`] query rows in one batch,
/// 2 to [`MAX_KV_SPLITS`] chunks, a cache that can hold a splitting view, and the work buffer
/// for the partials. Every thread decides the same from the same step.
pub(super) fn split_kv(call: &AttendCall<'_>, a: &StepArgs<'_>) -> bool {
    let (q, v) = (a.src(0), a.src(2));
    let splits = a.kv_splits;
    let need = split_work_bytes(q.layout.ne[1], q.layout.ne[2], v.layout.ne[0], call.n_kv);
    q.layout.ne[3] == 1
        && (2..=MAX_KV_SPLITS).contains(&splits)
        && need > 0
        && a.work_len >= need
        && (a.work as usize).is_multiple_of(4)
}

/// The chunks of a row that sees `visible` rows and how many rows each holds.
fn chunks(visible: usize, splits: usize) -> (usize, usize) {
    let view = visible.next_multiple_of(VIEW_PAD).max(VIEW_PAD);
    let n = if view >= SPLIT_MIN_VIEW { splits } else { 1 };
    (n, view.div_ceil(n))
}

/// Every query row's attention split by kv rows (see the module doc).
pub(super) fn attend_split_kv(
    call: &AttendCall<'_>,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
    sc: &mut HeadScratch,
) {
    let (q, v) = (a.src(0), a.src(2));
    let (n_q, n_head, dv, splits) = (q.layout.ne[1], q.layout.ne[2], v.layout.ne[0], a.kv_splits);
    let part = 2 + dv;
    let work = a.work as *mut f32;
    let n_head_kv = n_head / call.group;
    // Partials [row][head][chunk][2 + dv]; unit u is kv head u % n_head_kv of chunk
    // (u / n_head_kv) % splits of row u / (n_head_kv · splits). A view's last chunk is often
    // short (the view is padded, the rows are not), so a unit is one kv head's share of a
    // chunk, not the whole chunk: the threads even out over the heads (SmolLM2 at 300 cached
    // rows: chunks of 256 and 44 rows; by chunk one thread read 3 × 256 rows while the other
    // read 3 × 44 and waited).
    let mut run_unit = |u: usize| {
        let (i, c, hk) = (
            u / (n_head_kv * splits),
            u / n_head_kv % splits,
            u % n_head_kv,
        );
        visible_rows_of(call, i, sc);
        let (n, chunk) = chunks(sc.rows.len(), splits);
        if c >= n {
            return;
        }
        let out = HeadsOut::Partials {
            // SAFETY: i < n_q and c < splits: inside the work buffer (split_work_bytes).
            base: unsafe { work.add((i * n_head * splits + c) * part) },
            stride: splits * part,
        };
        let mut h = hk * call.group;
        while h < (hk + 1) * call.group {
            let end = (h + MAX_GROUP).min((hk + 1) * call.group);
            attend_heads_f16(call, (i, h..end), c * chunk..(c + 1) * chunk, out, a, sc);
            h = end;
        }
    };
    let units = n_q * splits * n_head_kv;
    if a.claimable {
        // Chunks to whichever thread is free (a thread a busy sibling core slows takes fewer).
        while let Some(claimed) = a.claim(units, 1) {
            claimed.for_each(&mut run_unit);
        }
    } else {
        (ctx.ith..units).step_by(ctx.nth).for_each(&mut run_unit);
    }
    if ctx.barrier().is_err() {
        return; // another thread panicked: the partials are incomplete.
    }
    for r in (ctx.ith..n_q * n_head).step_by(ctx.nth) {
        let (i, h) = (r / n_head, r % n_head);
        visible_rows_of(call, i, sc);
        let (n, _) = chunks(sc.rows.len(), splits);
        let acc = &mut sc.acc;
        acc.clear();
        acc.resize(dv, 0.0);
        let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
        for c in 0..n {
            // SAFETY: chunk c < n of (i, h) was written before the barrier, inside the work
            // buffer (i < n_q, h < n_head, c < splits).
            let p = unsafe { std::slice::from_raw_parts(work.add((r * splits + c) * part), part) };
            let (m_c, s_c) = (p[0], p[1]);
            if s_c == 0.0 {
                continue;
            }
            let m_new = m.max(m_c);
            let (old, new) = ((m - m_new).exp(), (m_c - m_new).exp());
            for (x, &y) in acc.iter_mut().zip(&p[2..]) {
                *x = *x * old + y * new;
            }
            s = s * old + s_c * new;
            m = m_new;
        }
        let inv = if s != 0.0 { 1.0 / s } else { 1.0 };
        let dst = a.dst.row_f32_ptr(h, i, 0);
        for (c, &x) in acc.iter().enumerate() {
            // SAFETY: output row (h, i) is [dv] contiguous and this thread's (r ≡ ith mod nth).
            unsafe { dst.add(c).write(x * inv) };
        }
    }
}
