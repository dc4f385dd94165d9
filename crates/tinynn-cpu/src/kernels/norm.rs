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

pub(crate) fn layer_norm(
    eps: f32,
    has_weight: bool,
    has_bias: bool,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let x = a.src(0);
    let weight = has_weight.then(|| a.src(1));
    let bias = has_bias.then(|| a.src(if has_weight { 2 } else { 1 }));
    let dst = a.dst;
    let n = dst.layout.ne[0];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        // SAFETY: contiguous F32 rows (builder-checked); this thread's row.
        let row = unsafe { x.row_f32(i1, i2, i3) };
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        let (mean, scale) = (mean as f32, (1.0 / (var + f64::from(eps)).sqrt()) as f32);
        let (inp, out) = (row.as_ptr(), dst.row_f32_ptr(i1, i2, i3));
        let w = weight.map(|w| w.row_f32_ptr(0, 0, 0));
        let b = bias.map(|b| b.row_f32_ptr(0, 0, 0));
        for j in 0..n {
            // SAFETY: j < ne0 in the input, output, weight and bias rows (all [ne0]).
            unsafe {
                let mut v = (inp.add(j).read() - mean) * scale;
                if let Some(w) = w {
                    v *= w.add(j).read();
                }
                if let Some(b) = b {
                    v += b.add(j).read();
                }
                out.add(j).write(v);
            }
        }
    }
}
