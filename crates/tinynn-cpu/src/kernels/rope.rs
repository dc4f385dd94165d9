//! Rotary position embedding, normal (adjacent pairs) and NEOX (halves) modes. Angles are
//! built as ggml builds them: `theta_i = pos * freq_scale * base^(-2i/n_dims)`, the power taken
//! by repeated f32 multiplication.

use tinynn_core::ops::{Rope, RopeMode};

use super::{split, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;

pub(crate) fn rope(r: &Rope, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, pos) = (a.src(0), a.src(1));
    let dst = a.dst;
    let [head_dim, n_head, n_tok, _] = dst.layout.ne;
    // SAFETY: positions are a contiguous I32 [n_tok] tensor (builder-checked).
    let positions = unsafe { pos.i32s() };
    if positions.len() != n_tok {
        a.errors.record(ERR_KERNEL, 0);
        return;
    }
    let theta_scale = r.freq_base.powf(-2.0 / r.n_dims as f32);
    let half = r.n_dims / 2;
    for row in split(n_head * n_tok, ctx.ith, ctx.nth) {
        let (h, t) = (row % n_head, row / n_head);
        // Contiguous F32 rows; this thread's row; in place each pair is read before it is written.
        let (xin, out) = (x.row_f32_ptr(h, t, 0), dst.row_f32_ptr(h, t, 0));
        let mut theta = positions[t] as f32;
        for i in 0..half {
            let angle = theta * r.freq_scale;
            let (s, c) = angle.sin_cos();
            let (i0, i1) = match r.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            // SAFETY: i0, i1 < n_dims <= head_dim, inside both rows.
            unsafe {
                let (x0, x1) = (xin.add(i0).read(), xin.add(i1).read());
                out.add(i0).write(x0 * c - x1 * s);
                out.add(i1).write(x0 * s + x1 * c);
            }
            theta *= theta_scale;
        }
        for j in r.n_dims..head_dim {
            // SAFETY: j < head_dim.
            unsafe { out.add(j).write(xin.add(j).read()) };
        }
    }
}
