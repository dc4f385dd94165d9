//! Row reductions (sum, mean, argmax) and orderings (argsort, top-k). Sums accumulate in f64.

use std::cmp::Ordering;

use super::{row_index, split, RawTensor, StepArgs};
use crate::pool::Ctx;

/// Element i0 of row (i1, i2, i3).
#[inline]
fn at(x: &RawTensor, i0: usize, row: (usize, usize, usize)) -> f32 {
    // SAFETY: callers pass i0 < ne0 and a row of x.
    unsafe { x.f32_at([i0, row.0, row.1, row.2]) }
}

fn row_sum(x: &RawTensor, row: (usize, usize, usize), squares: bool) -> f64 {
    (0..x.layout.ne[0])
        .map(|i0| {
            let v = f64::from(at(x, i0, row));
            if squares {
                v * v
            } else {
                v
            }
        })
        .sum()
}

/// Σ of a row in eight interleaved f64 partial sums (independent add chains, so the loop runs
/// at memory speed instead of one add latency per element), combined pairwise.
fn row_sum_lanes<const SQUARES: bool>(row: &[f32]) -> f64 {
    let f = |v: f32| {
        let v = f64::from(v);
        if SQUARES {
            v * v
        } else {
            v
        }
    };
    let mut acc = [0f64; 8];
    let chunks = row.chunks_exact(8);
    let tail: f64 = chunks.remainder().iter().map(|&v| f(v)).sum();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let a4 = [0, 1, 2, 3].map(|i| acc[i] + acc[i + 4]);
    (a4[0] + a4[2]) + (a4[1] + a4[3]) + tail
}

/// `Σx` (`Op::Sum`) or `Σx²` (`Op::SumSq`, `squares`).
pub(crate) fn sum(squares: bool, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    if ctx.ith != 0 {
        return;
    }
    let x = a.src(0);
    // Normal mode, contiguous rows (the gradient norms of training): interleaved sums.
    let lanes = !a.strict && x.layout.dtype == tinynn_format::GgmlType::F32 && x.layout.nb[0] == 4;
    let total: f64 = (0..x.layout.n_rows())
        .map(|r| {
            let row = row_index(&x.layout, r);
            if lanes {
                // SAFETY: row r of x holds ne0 contiguous f32s.
                let v = unsafe { x.row_f32(row.0, row.1, row.2) };
                if squares {
                    row_sum_lanes::<true>(v)
                } else {
                    row_sum_lanes::<false>(v)
                }
            } else {
                row_sum(&x, row, squares)
            }
        })
        .sum();
    // SAFETY: the output is one F32, written by thread 0 only.
    unsafe { a.dst.row_f32_ptr(0, 0, 0).write(total as f32) };
}

pub(crate) fn sum_rows(mean: bool, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let n = x.layout.ne[0] as f64;
    for r in split(x.layout.n_rows(), ctx.ith, ctx.nth) {
        let row = row_index(&x.layout, r);
        let s = row_sum(&x, row, false);
        let v = if mean { s / n } else { s };
        // SAFETY: output row `row` is [1] F32, this thread's.
        unsafe { a.dst.row_f32_ptr(row.0, row.1, row.2).write(v as f32) };
    }
}

/// Writes I32 `v` as element `i` of the contiguous output.
#[inline]
fn put_i32(a: &StepArgs<'_>, i: usize, v: i32) {
    // SAFETY: callers pass an index inside the contiguous I32 output, owned by this thread.
    unsafe { (a.dst.ptr as *mut i32).add(i).write(v) };
}

pub(crate) fn argmax(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    for r in split(x.layout.n_rows(), ctx.ith, ctx.nth) {
        let row = row_index(&x.layout, r);
        let (mut best, mut best_v) = (0usize, f32::NEG_INFINITY);
        for i0 in 0..x.layout.ne[0] {
            let v = at(&x, i0, row);
            if v > best_v || (i0 == 0 && v.is_nan()) {
                best = i0;
                best_v = v;
            }
        }
        put_i32(a, r, best as i32);
    }
}

/// Orders indices by value (NaN last), ties by index: a total, stable-equivalent order.
fn by_value(
    x: &RawTensor,
    row: (usize, usize, usize),
    descending: bool,
) -> impl Fn(&i32, &i32) -> Ordering + '_ {
    move |&p, &q| {
        let (vp, vq) = (at(x, p as usize, row), at(x, q as usize, row));
        let ord = if descending {
            vq.total_cmp(&vp)
        } else {
            vp.total_cmp(&vq)
        };
        ord.then(p.cmp(&q))
    }
}

pub(crate) fn argsort(descending: bool, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let n = x.layout.ne[0];
    for r in split(x.layout.n_rows(), ctx.ith, ctx.nth) {
        let row = row_index(&x.layout, r);
        // SAFETY: output row r is n contiguous I32 values owned by this thread.
        let out = unsafe { std::slice::from_raw_parts_mut((a.dst.ptr as *mut i32).add(r * n), n) };
        for (i, o) in out.iter_mut().enumerate() {
            *o = i as i32;
        }
        // Unstable sort with the index as tie-breaker: deterministic, and no allocation.
        out.sort_unstable_by(by_value(&x, row, descending));
    }
}

pub(crate) fn top_k(k: usize, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    for r in split(x.layout.n_rows(), ctx.ith, ctx.nth) {
        let row = row_index(&x.layout, r);
        // SAFETY: output row r is k contiguous I32 values owned by this thread.
        let out = unsafe { std::slice::from_raw_parts_mut((a.dst.ptr as *mut i32).add(r * k), k) };
        let cmp = by_value(&x, row, true);
        let mut len = 0;
        for j in 0..x.layout.ne[0] as i32 {
            if len == k && cmp(&j, &out[k - 1]) != Ordering::Less {
                continue;
            }
            // Insert j keeping out[..len] ordered (largest first).
            let mut pos = len.min(k - 1);
            if len < k {
                len += 1;
            }
            while pos > 0 && cmp(&j, &out[pos - 1]) == Ordering::Less {
                out[pos] = out[pos - 1];
                pos -= 1;
            }
            out[pos] = j;
        }
    }
}
