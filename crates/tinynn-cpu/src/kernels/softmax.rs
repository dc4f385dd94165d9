//! Softmax over rows of `x * scale + mask` (f64 sum, as ggml).

use super::{row_index, split, StepArgs};
use crate::pool::Ctx;

pub(crate) fn soft_max(scale: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let mask = a.src[1];
    let dst = a.dst;
    let n = dst.layout.ne[0];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        // SAFETY: rows are contiguous F32 (builder-checked); the mask row index is reduced
        // modulo the mask's dims 2 and 3 and i1 < the mask's ne1 (checked at build time).
        let (xin, m) = unsafe {
            let m = mask.map(|m| {
                m.row_f32(i1, i2 % m.layout.ne[2], i3 % m.layout.ne[3])
                    .as_ptr()
            });
            (x.row_f32(i1, i2, i3).as_ptr(), m)
        };
        // SAFETY: this thread's row.
        let out = unsafe { dst.row_f32_mut(i1, i2, i3) };
        let mut max = f32::NEG_INFINITY;
        for (j, o) in out.iter_mut().enumerate().take(n) {
            // SAFETY: j < ne0 for both rows.
            let v = unsafe { *xin.add(j) } * scale + m.map_or(0.0, |m| unsafe { *m.add(j) });
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
