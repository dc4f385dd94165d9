//! Convolutions: im2col (patches as columns), and Mamba's depthwise convolution and selective
//! scan.

use super::{row_index, split, StepArgs};
use crate::pool::Ctx;

pub(crate) fn im2col(
    stride: [usize; 2],
    pad: [usize; 2],
    dilation: [usize; 2],
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (kernel, input, dst) = (a.src(0), a.src(1), a.dst);
    let [kw, kh, ic, _] = kernel.layout.ne;
    let [iw, ih, _, _] = input.layout.ne;
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (ow, oh, n) = row_index(&dst.layout, r);
        let out = dst.row_f32_ptr(ow, oh, n);
        for c in 0..ic {
            for y in 0..kh {
                for x in 0..kw {
                    let ix = (ow * stride[0] + x * dilation[0])
                        .checked_sub(pad[0])
                        .filter(|&v| v < iw);
                    let iy = (oh * stride[1] + y * dilation[1])
                        .checked_sub(pad[1])
                        .filter(|&v| v < ih);
                    let v = match (ix, iy) {
                        // SAFETY: (ix, iy, c, n) is inside the input.
                        (Some(ix), Some(iy)) => unsafe { input.f32_at([ix, iy, c, n]) },
                        _ => 0.0,
                    };
                    // SAFETY: the column index is below IC·KH·KW, this thread's row.
                    unsafe { out.add((c * kh + y) * kw + x).write(v) };
                }
            }
        }
    }
}

pub(crate) fn ssm_conv(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (sx, c, dst) = (a.src(0), a.src(1), a.dst);
    let d_conv = c.layout.ne[0];
    let d_inner = dst.layout.ne[0];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (t, s, _) = row_index(&dst.layout, r);
        let out = dst.row_f32_ptr(t, s, 0);
        for i in 0..d_inner {
            let mut acc = 0f32;
            for j in 0..d_conv {
                // SAFETY: t + j < d_conv - 1 + n_t = sx's ne0; i < d_inner.
                acc += unsafe { sx.f32_at([t + j, i, s, 0]) * c.f32_at([j, i, 0, 0]) };
            }
            // SAFETY: this thread's row of dst.
            unsafe { out.add(i).write(acc) };
        }
    }
}

#[inline]
fn softplus(x: f32) -> f32 {
    if x <= 20.0 {
        x.exp().ln_1p()
    } else {
        x
    }
}

pub(crate) fn ssm_scan(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (s0, x, dt, am, bm, cm) = (a.src(0), a.src(1), a.src(2), a.src(3), a.src(4), a.src(5));
    let [d_state, d_inner, n_s, _] = s0.layout.ne;
    let n_t = x.layout.ne[1];
    let out = a.dst.row_f32_ptr(0, 0, 0);
    let states = d_inner * n_t * n_s;
    for job in split(d_inner * n_s, ctx.ith, ctx.nth) {
        let (i, s) = (job % d_inner, job / d_inner);
        let state = |n: usize| states + n + d_state * (i + d_inner * s);
        for n in 0..d_state {
            // SAFETY: (n, i, s) is inside the state; the state slot is this thread's (channel i of seq s).
            unsafe { out.add(state(n)).write(s0.f32_at([n, i, s, 0])) };
        }
        for t in 0..n_t {
            // SAFETY: (i, t, s) is inside x and dt.
            let (dt_soft, xv) =
                unsafe { (softplus(dt.f32_at([i, t, s, 0])), x.f32_at([i, t, s, 0])) };
            let x_dt = xv * dt_soft;
            let mut y = 0f32;
            for n in 0..d_state {
                // SAFETY: all indices are inside A, B, C (builder-checked shapes) and this
                // thread's state slot.
                unsafe {
                    let p = out.add(state(n));
                    let st = p.read() * (dt_soft * am.f32_at([n, i, 0, 0])).exp()
                        + bm.f32_at([n, t, s, 0]) * x_dt;
                    p.write(st);
                    y += st * cm.f32_at([n, t, s, 0]);
                }
            }
            // SAFETY: output (i, t, s) is this thread's.
            unsafe { out.add(i + d_inner * (t + n_t * s)).write(y) };
        }
    }
}
