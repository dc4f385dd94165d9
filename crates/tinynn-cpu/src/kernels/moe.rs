//! Mixture of experts: a matrix product per (token, slot) with the expert its id names, and
//! per-expert biases.

use super::copy::{read_chunk, CHUNK};
use super::{row_index, split, StepArgs, ERR_INDEX, ERR_KERNEL};
use crate::pool::Ctx;

/// Expert id `(e, t)`, or `None` (recorded as an error) when it names no expert.
pub(super) fn expert(
    a: &StepArgs<'_>,
    ids: &[i32],
    n_used: usize,
    e: usize,
    t: usize,
    n_expert: usize,
) -> Option<usize> {
    let id = ids[e + n_used * t];
    if id < 0 || id as usize >= n_expert {
        a.errors.record(ERR_INDEX, id as u32);
        return None;
    }
    Some(id as usize)
}

pub(crate) fn mul_mat_id(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    if a.strict {
        return mul_mat_id_strict(a, ctx);
    }
    let (w, x, ids_t, dst) = (a.src(0), a.src(1), a.src(2), a.dst);
    // SAFETY: ids are contiguous I32 [n_used, n_tokens] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let Some((work, dot)) = super::matmul::prepare_activations(a, &w, &x, ctx) else {
        return;
    };
    let [n_out, n_used, n_tok, _] = dst.layout.ne;
    let (b1, n_expert) = (x.layout.ne[1], w.layout.ne[2]);
    for n in split(n_out, ctx.ith, ctx.nth) {
        for t in 0..n_tok {
            for e in 0..n_used {
                let v = match expert(a, ids, n_used, e, t, n_expert) {
                    // SAFETY: expert row n exists; the work row was written before the barrier.
                    Some(ex) => unsafe { dot(w.row(n, ex, 0), work.row(e % b1 + b1 * t, 0, 0)) },
                    None => 0.0,
                };
                // SAFETY: element (n, e, t) is inside dst; column n is this thread's.
                unsafe { dst.set_float([n, e, t, 0], v) };
            }
        }
    }
}

/// Reference mode: each expert row dequantized exactly and dotted with the f32 activations in
/// f64 (the activations are not rounded to the weights' dot type).
fn mul_mat_id_strict(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (w, x, ids_t, dst) = (a.src(0), a.src(1), a.src(2), a.dst);
    // SAFETY: ids are contiguous I32 [n_used, n_tokens] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let [n_out, n_used, n_tok, _] = dst.layout.ne;
    let (k, b1, n_expert) = (w.layout.ne[0], x.layout.ne[1], w.layout.ne[2]);
    let mut buf = [0f32; CHUNK];
    for n in split(n_out, ctx.ith, ctx.nth) {
        for t in 0..n_tok {
            for e in 0..n_used {
                let mut acc = 0f64;
                if let Some(ex) = expert(a, ids, n_used, e, t, n_expert) {
                    let mut c0 = 0;
                    while c0 < k {
                        let len = CHUNK.min(k - c0);
                        // SAFETY: row n of expert ex exists with contiguous rows; c0..c0 + len
                        // is whole blocks of it.
                        if !unsafe { read_chunk(&w, (n, ex, 0), c0, &mut buf[..len]) } {
                            a.errors.record(ERR_KERNEL, 0);
                        }
                        for (j, &wv) in buf[..len].iter().enumerate() {
                            // SAFETY: (c0 + j, e mod b1, t) is inside x.
                            acc += f64::from(wv)
                                * f64::from(unsafe { x.f32_at([c0 + j, e % b1, t, 0]) });
                        }
                        c0 += len;
                    }
                }
                // SAFETY: element (n, e, t) is inside dst; column n is this thread's.
                unsafe { dst.set_float([n, e, t, 0], acc as f32) };
            }
        }
    }
}

pub(crate) fn add_id(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, b, ids_t, dst) = (a.src(0), a.src(1), a.src(2), a.dst);
    // SAFETY: ids are contiguous I32 [n_used, n_tokens] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let [n, n_used, _, _] = dst.layout.ne;
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (e, t, _) = row_index(&dst.layout, r);
        let bias = expert(a, ids, n_used, e, t, b.layout.ne[1]);
        let out = dst.row_f32_ptr(e, t, 0);
        for i in 0..n {
            // SAFETY: (i, e, t) is inside x and dst (this thread's row); bias row ex exists.
            unsafe {
                let v = x.f32_at([i, e, t, 0]) + bias.map_or(0.0, |ex| b.f32_at([i, ex, 0, 0]));
                out.add(i).write(v);
            }
        }
    }
}
