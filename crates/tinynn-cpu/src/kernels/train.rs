//! Training kernels: cross-entropy loss with a label mask, and the AdamW and SGD steps
//! (element-wise, in place on persistent tensors, hyperparameters read at run time).

use super::{split, StepArgs};
use crate::pool::Ctx;

/// Most threads whose partial sums fit the planned work buffer.
const MAX_PARTIALS: usize = 64;

pub(crate) fn cross_entropy_loss(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (logits, labels_t) = (a.src(0), a.src(1));
    // SAFETY: labels are contiguous I32 [rows] (builder-checked).
    let labels = unsafe { labels_t.i32s() };
    let v = logits.layout.ne[0];
    let (ith, nth) = if ctx.nth <= MAX_PARTIALS {
        (ctx.ith, ctx.nth)
    } else {
        (ctx.ith, 1)
    };
    let (mut loss, mut count) = (0f64, 0f64);
    if ith < nth {
        for r in split(labels.len(), ith, nth) {
            let label = labels[r];
            if label < 0 || label as usize >= v {
                continue;
            }
            let (i1, i2, i3) = super::row_index(&logits.layout, r);
            // SAFETY: contiguous F32 rows (builder-checked).
            let row = unsafe { logits.row_f32(i1, i2, i3) };
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let sum: f64 = if a.strict {
                row.iter().map(|&x| f64::from(x - max).exp()).sum()
            } else {
                crate::simd::vexp::sum_exp_f64(row, max)
            };
            loss += sum.ln() - f64::from(row[label as usize] - max);
            count += 1.0;
        }
    }
    let partials = a.work as *mut f64;
    if ith < nth {
        // SAFETY: the work buffer holds MAX_PARTIALS (loss, count) pairs; slot ith is this thread's.
        unsafe {
            partials.add(2 * ith).write(loss);
            partials.add(2 * ith + 1).write(count);
        }
    }
    ctx.barrier();
    if ctx.ith == 0 {
        let (mut total, mut n) = (0f64, 0f64);
        for t in 0..nth {
            // SAFETY: written by thread t before the barrier.
            unsafe {
                total += partials.add(2 * t).read();
                n += partials.add(2 * t + 1).read();
            }
        }
        let mean = if n > 0.0 { total / n } else { 0.0 };
        // SAFETY: the [1] output, written by thread 0 only.
        unsafe { a.dst.row_f32_ptr(0, 0, 0).write(mean as f32) };
    }
}

/// The n-th hyperparameter.
fn hp(a: &StepArgs<'_>, src: usize, n: usize) -> f32 {
    // SAFETY: hyperparameters are an F32 [7] / [3] tensor (builder-checked), n within it.
    unsafe { a.src(src).f32_at([n, 0, 0, 0]) }
}

pub(crate) fn adamw(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let [lr, beta1, beta2, eps, wd, beta1h, beta2h] = std::array::from_fn(|i| hp(a, 4, i));
    let (w, g, m, v) = (
        a.dst.row_f32_ptr(0, 0, 0),
        a.src(1).row_f32_ptr(0, 0, 0),
        a.src(2).row_f32_ptr(0, 0, 0),
        a.src(3).row_f32_ptr(0, 0, 0),
    );
    let keep = 1.0 - lr * wd;
    for i in split(a.dst.layout.n_elements(), ctx.ith, ctx.nth) {
        // SAFETY: all four tensors are contiguous F32 of the parameter's size; element i is
        // this thread's, in each.
        unsafe {
            let gi = g.add(i).read();
            let mi = m.add(i).read() * beta1 + gi * (1.0 - beta1);
            let vi = v.add(i).read() * beta2 + gi * gi * (1.0 - beta2);
            m.add(i).write(mi);
            v.add(i).write(vi);
            let step = (mi * beta1h) / ((vi * beta2h).sqrt() + eps);
            w.add(i).write(w.add(i).read() * keep - lr * step);
        }
    }
}

pub(crate) fn sgd(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let [lr, momentum, wd] = std::array::from_fn(|i| hp(a, 3, i));
    let (w, g, vel) = (
        a.dst.row_f32_ptr(0, 0, 0),
        a.src(1).row_f32_ptr(0, 0, 0),
        a.src(2).row_f32_ptr(0, 0, 0),
    );
    for i in split(a.dst.layout.n_elements(), ctx.ith, ctx.nth) {
        // SAFETY: contiguous F32 tensors of the parameter's size; element i is this thread's.
        unsafe {
            let vi = momentum * vel.add(i).read() + g.add(i).read();
            vel.add(i).write(vi);
            w.add(i).write(w.add(i).read() * (1.0 - lr * wd) - lr * vi);
        }
    }
}
