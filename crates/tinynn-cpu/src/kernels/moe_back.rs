//! The routing-weight pick of a mixture of experts and the gradients of its expert products.
//! Every output element is summed in a fixed order (slots, then tokens, ascending), whatever
//! the thread count.

use super::copy::{read_chunk, CHUNK};
use super::moe::expert;
use super::{split, StepArgs, ERR_INDEX, ERR_KERNEL};
use crate::pool::Ctx;

/// `out[j, t] = a[ids[j, t], t]`.
pub(crate) fn take_rows(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, ids_t, dst) = (a.src(0), a.src(1), a.dst);
    // SAFETY: ids are contiguous I32 [k, n] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let [k, n, _, _] = dst.layout.ne;
    let rows = x.layout.ne[0];
    for t in split(n, ctx.ith, ctx.nth) {
        for j in 0..k {
            let id = ids[j + k * t];
            let v = if id < 0 || id as usize >= rows {
                a.errors.record(ERR_INDEX, id as u32);
                0.0
            } else {
                // SAFETY: (id, t) is inside x.
                unsafe { x.f32_at([id as usize, t, 0, 0]) }
            };
            // SAFETY: (j, t) is inside dst; column t is this thread's.
            unsafe { dst.set_float([j, t, 0, 0], v) };
        }
    }
}

/// Zeros, then `out[ids[j, t], t] += dy[j, t]` in ascending j.
pub(crate) fn take_rows_back(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (dy, ids_t, dst) = (a.src(0), a.src(1), a.dst);
    // SAFETY: ids are contiguous I32 [k, n] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let [rows, n, _, _] = dst.layout.ne;
    let k = dy.layout.ne[0];
    for t in split(n, ctx.ith, ctx.nth) {
        let out = dst.row_f32_ptr(t, 0, 0);
        for r in 0..rows {
            // SAFETY: column t of dst (a contiguous F32 row) is this thread's.
            unsafe { out.add(r).write(0.0) };
        }
        for j in 0..k {
            let id = ids[j + k * t];
            if id < 0 || id as usize >= rows {
                a.errors.record(ERR_INDEX, id as u32);
                continue;
            }
            // SAFETY: (j, t) is inside dy; element id of this thread's column exists.
            unsafe {
                let g = dy.f32_at([j, t, 0, 0]);
                let p = out.add(id as usize);
                p.write(p.read() + g);
            }
        }
    }
}

/// `dx[:, e, t] = W[ids[e, t]]ᵀ · dy[:, e, t]`, each (slot, token) column one thread's, W's
/// rows read (dequantized when quantized) a chunk of K at a time and summed in f64.
pub(crate) fn mul_mat_id_t(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (w, dy, ids_t, dst) = (a.src(0), a.src(1), a.src(2), a.dst);
    // SAFETY: ids are contiguous I32 [n_used, n_tokens] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let [k, n_used, n_tok, _] = dst.layout.ne;
    let (n, n_expert) = (w.layout.ne[1], w.layout.ne[2]);
    let mut buf = [0f32; CHUNK];
    let mut acc = [0f64; CHUNK];
    for col in split(n_used * n_tok, ctx.ith, ctx.nth) {
        let (e, t) = (col % n_used, col / n_used);
        let out = dst.row_f32_ptr(e, t, 0);
        let Some(ex) = expert(a, ids, n_used, e, t, n_expert) else {
            for i in 0..k {
                // SAFETY: column (e, t) of dst is this thread's.
                unsafe { out.add(i).write(0.0) };
            }
            continue;
        };
        let mut c0 = 0;
        while c0 < k {
            let len = CHUNK.min(k - c0);
            acc[..len].fill(0.0);
            for ni in 0..n {
                // SAFETY: row ni of expert ex exists with contiguous rows (builder-checked);
                // c0..c0 + len is whole blocks of it (CHUNK is a multiple of every block).
                if !unsafe { read_chunk(&w, (ni, ex, 0), c0, &mut buf[..len]) } {
                    a.errors.record(ERR_KERNEL, 0);
                }
                // SAFETY: (ni, e, t) is inside dy.
                let g = f64::from(unsafe { dy.f32_at([ni, e, t, 0]) });
                for (x, &wv) in acc[..len].iter_mut().zip(&buf[..len]) {
                    *x += g * f64::from(wv);
                }
            }
            for (i, &x) in acc[..len].iter().enumerate() {
                // SAFETY: element c0 + i of this thread's column.
                unsafe { out.add(c0 + i).write(x as f32) };
            }
            c0 += len;
        }
    }
}

/// `dW[:, n, x] = Σ_{(e, t): ids[e, t] = x} dy[n, e, t] · x[:, e mod b1, t]`, each (row n,
/// expert x) one thread's.
pub(crate) fn out_prod_id(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, dy, ids_t, dst) = (a.src(0), a.src(1), a.src(2), a.dst);
    // SAFETY: ids are contiguous I32 [n_used, n_tokens] (builder-checked).
    let ids = unsafe { ids_t.i32s() };
    let [k, n, n_expert, _] = dst.layout.ne;
    let [_, n_used, n_tok, _] = dy.layout.ne;
    let b1 = x.layout.ne[1];
    for r in split(n * n_expert, ctx.ith, ctx.nth) {
        let (ni, ex) = (r % n, r / n);
        let out = dst.row_f32_ptr(ni, ex, 0);
        for i in 0..k {
            // SAFETY: row (ni, ex) of dst is this thread's.
            unsafe { out.add(i).write(0.0) };
        }
        for t in 0..n_tok {
            for e in 0..n_used {
                let id = ids[e + n_used * t];
                if id < 0 || id as usize >= n_expert {
                    if r == 0 {
                        a.errors.record(ERR_INDEX, id as u32);
                    }
                    continue;
                }
                if id as usize != ex {
                    continue;
                }
                // SAFETY: (ni, e, t) is inside dy.
                let g = unsafe { dy.f32_at([ni, e, t, 0]) };
                for i in 0..k {
                    // SAFETY: (i, e mod b1, t) is inside x; element i of this thread's row.
                    unsafe {
                        let p = out.add(i);
                        p.write(p.read() + g * x.f32_at([i, e % b1, t, 0]));
                    }
                }
            }
        }
    }
}
