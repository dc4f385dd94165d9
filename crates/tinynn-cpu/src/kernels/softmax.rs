//! Softmax over rows of `x * scale + slope * mask` (f64 sum, as ggml), with ALiBi slopes.

use super::{row_index, split, StepArgs};
use crate::pool::Ctx;

/// ALiBi's slope for head `h` of `n_head` (1 when `max_bias` is 0).
pub(crate) fn alibi_slope(max_bias: f32, h: usize, n_head: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_log2 as f32);
    let m1 = 2f32.powf(-max_bias / 2.0 / n_log2 as f32);
    if h < n_log2 {
        m0.powi(h as i32 + 1)
    } else {
        m1.powi(2 * (h - n_log2) as i32 + 1)
    }
}

pub(crate) fn soft_max(scale: f32, max_bias: f32, has_mask: bool, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let mask = has_mask.then(|| a.src(1));
    let dst = a.dst;
    let n = dst.layout.ne[0];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        let slope = alibi_slope(max_bias, i2, dst.layout.ne[2]);
        // The mask row index is reduced modulo the mask's dims 2 and 3; i1 < the mask's ne1
        // (builder-checked). Rows are contiguous F32.
        let m = mask.map(|m| m.row_f32_ptr(i1, i2 % m.layout.ne[2], i3 % m.layout.ne[3]));
        let xin = x.row_f32_ptr(i1, i2, i3);
        // SAFETY: this thread's output row; softmax never runs in place, so it aliases nothing.
        let out = unsafe { dst.row_f32_mut(i1, i2, i3) };
        let mut max = f32::NEG_INFINITY;
        for (j, o) in out.iter_mut().enumerate().take(n) {
            // SAFETY: j < ne0 for the input and mask rows.
            let v = unsafe { xin.add(j).read() } * scale
                + m.map_or(0.0, |m| slope * unsafe { m.add(j).read() });
            *o = v;
            max = max.max(v);
        }
        let mut sum = 0f64;
        for o in out.iter_mut() {
            let e = if max == f32::NEG_INFINITY {
                0.0
            } else {
                (*o - max).exp()
            };
            *o = e;
            sum += f64::from(e);
        }
        let inv = if sum > 0.0 { (1.0 / sum) as f32 } else { 0.0 };
        for o in out.iter_mut() {
            *o *= inv;
        }
    }
}
