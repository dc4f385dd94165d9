//! concat: two tensors joined along one dimension.

use super::{row_index, split, StepArgs};
use crate::pool::Ctx;

pub(crate) fn concat(dim: usize, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, y) = (a.src(0), a.src(1));
    let dst = a.dst;
    let split_at = x.layout.ne[dim];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        let out = dst.row_f32_ptr(i1, i2, i3);
        for i0 in 0..dst.layout.ne[0] {
            let mut i = [i0, i1, i2, i3];
            let v = if i[dim] < split_at {
                // SAFETY: i is inside x (all other dims equal, builder-checked).
                unsafe { x.f32_at(i) }
            } else {
                i[dim] -= split_at;
                // SAFETY: i is inside y after the shift.
                unsafe { y.f32_at(i) }
            };
            // SAFETY: this thread's contiguous output row.
            unsafe { out.add(i0).write(v) };
        }
    }
}
