//! RMS normalization of rows (ggml accumulates the sum of squares in f64).

use super::{row_index, split, StepArgs};
use crate::pool::Ctx;

pub(crate) fn rms_norm(eps: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let dst = a.dst;
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        // SAFETY: rows are contiguous F32 (builder-checked); row r is this thread's. In place,
        // input and output are the same row, read fully before it is written.
        let sum: f64 = unsafe { x.row_f32(i1, i2, i3) }
            .iter()
            .map(|&v| f64::from(v) * f64::from(v))
            .sum();
        let mean = (sum / dst.layout.ne[0] as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        let (inp, out) = (x.row_f32_ptr(i1, i2, i3), dst.row_f32_ptr(i1, i2, i3));
        for j in 0..dst.layout.ne[0] {
            // SAFETY: j < ne0 in both rows; element j is read before it is written.
            unsafe { out.add(j).write(inp.add(j).read() * scale) };
        }
    }
}
