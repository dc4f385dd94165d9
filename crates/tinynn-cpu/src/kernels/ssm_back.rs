//! Gradients of Mamba's depthwise convolution and selective scan. Every element is summed in
//! a fixed order whatever the thread count: the convolution's work splits by channel, the
//! scan's by sequence (each sequence's share of A's gradient is its own; the graph sums them).

use super::{split, StepArgs};
use crate::pool::Ctx;

/// `d_sx[τ, i, s] = Σ_j dy[i, τ − j, s]·c[j, i]` and `dc[j, i] = Σ_{s, t} dy[i, t, s]·sx[t + j,
/// i, s]`, flat, for the channels of this thread.
pub(crate) fn ssm_conv_back(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (sx, c, dy) = (a.src(0), a.src(1), a.src(2));
    let [len, d_inner, n_s, _] = sx.layout.ne;
    let d_conv = c.layout.ne[0];
    let n_t = dy.layout.ne[1];
    let out = a.dst.row_f32_ptr(0, 0, 0);
    let dc_at = len * d_inner * n_s;
    for i in split(d_inner, ctx.ith, ctx.nth) {
        for s in 0..n_s {
            for tau in 0..len {
                let mut acc = 0f64;
                for j in 0..d_conv.min(tau + 1) {
                    let t = tau - j;
                    if t < n_t {
                        // SAFETY: (i, t, s) is inside dy and (j, i) inside c (checked shapes).
                        acc +=
                            unsafe { f64::from(dy.f32_at([i, t, s, 0]) * c.f32_at([j, i, 0, 0])) };
                    }
                }
                // SAFETY: element (τ, i, s) of the input's gradient; channel i is this thread's.
                unsafe { out.add(tau + len * (i + d_inner * s)).write(acc as f32) };
            }
        }
        for j in 0..d_conv {
            let mut acc = 0f64;
            for s in 0..n_s {
                for t in 0..n_t {
                    // SAFETY: t + j < len; (i, t, s) inside dy.
                    acc +=
                        unsafe { f64::from(dy.f32_at([i, t, s, 0]) * sx.f32_at([t + j, i, s, 0])) };
                }
            }
            // SAFETY: element (j, i) of the weights' gradient; channel i is this thread's.
            unsafe { out.add(dc_at + j + d_conv * i).write(acc as f32) };
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

/// softplus'(x) = sigmoid(x) (1 where the forward passes x through).
#[inline]
fn softplus_grad(x: f32) -> f64 {
    if x <= 20.0 {
        1.0 / (1.0 + (-f64::from(x)).exp())
    } else {
        1.0
    }
}

/// The scan run backward: for each sequence of this thread and each channel, the states are
/// recomputed forward, then the gradient flows back from the last token (see `Op::SsmScanBack`
/// for the layout of the result).
pub(crate) fn ssm_scan_back(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (s0, x, dt, am, bm, cm, dy) = (
        a.src(0),
        a.src(1),
        a.src(2),
        a.src(3),
        a.src(4),
        a.src(5),
        a.src(6),
    );
    let [d_state, d_inner, n_s, _] = s0.layout.ne;
    let n_t = x.layout.ne[1];
    let out = a.dst.row_f32_ptr(0, 0, 0);
    let dyp = dy.row_f32_ptr(0, 0, 0);
    let n_state = d_state * d_inner * n_s;
    let n_x = d_inner * n_t * n_s;
    let n_b = d_state * n_t * n_s;
    let (off_x, off_dt) = (n_state, n_state + n_x);
    let (off_a, off_b) = (n_state + 2 * n_x, 2 * n_state + 2 * n_x);
    let off_c = off_b + n_b;
    let mut hist = vec![0f32; (n_t + 1) * d_state];
    let mut g = vec![0f64; d_state];
    let mut db = vec![0f64; d_state * n_t];
    let mut dc = vec![0f64; d_state * n_t];
    let mut da = vec![0f64; d_state];
    for s in split(n_s, ctx.ith, ctx.nth) {
        db.fill(0.0);
        dc.fill(0.0);
        for i in 0..d_inner {
            // Forward: hist[t + 1] is the state after token t, hist[0] the initial one.
            for (n, h) in hist[..d_state].iter_mut().enumerate() {
                // SAFETY: (n, i, s) is inside the state.
                *h = unsafe { s0.f32_at([n, i, s, 0]) };
            }
            for t in 0..n_t {
                // SAFETY: every index is inside its tensor (checked shapes).
                unsafe {
                    let d = softplus(dt.f32_at([i, t, s, 0]));
                    let x_dt = x.f32_at([i, t, s, 0]) * d;
                    for n in 0..d_state {
                        let prev = hist[t * d_state + n];
                        hist[(t + 1) * d_state + n] = prev * (d * am.f32_at([n, i, 0, 0])).exp()
                            + bm.f32_at([n, t, s, 0]) * x_dt;
                    }
                }
            }
            // Backward from the final state's gradient.
            for (n, gn) in g.iter_mut().enumerate() {
                // SAFETY: the final states follow the outputs in dy.
                *gn = f64::from(unsafe { dyp.add(n_x + n + d_state * (i + d_inner * s)).read() });
            }
            let da = &mut da;
            da.fill(0.0);
            for t in (0..n_t).rev() {
                // SAFETY: every index is inside its tensor (checked shapes).
                unsafe {
                    let dyt = f64::from(dyp.add(i + d_inner * (t + n_t * s)).read());
                    let raw = dt.f32_at([i, t, s, 0]);
                    let d = f64::from(softplus(raw));
                    let xv = f64::from(x.f32_at([i, t, s, 0]));
                    let (mut d_delta, mut dx) = (0f64, 0f64);
                    for n in 0..d_state {
                        let h = f64::from(hist[(t + 1) * d_state + n]);
                        let prev = f64::from(hist[t * d_state + n]);
                        let an = f64::from(am.f32_at([n, i, 0, 0]));
                        let bn = f64::from(bm.f32_at([n, t, s, 0]));
                        let cn = f64::from(cm.f32_at([n, t, s, 0]));
                        g[n] += dyt * cn;
                        dc[n + d_state * t] += dyt * h;
                        let decay = (d * an).exp();
                        d_delta += g[n] * (prev * decay * an + bn * xv);
                        da[n] += g[n] * prev * decay * d;
                        db[n + d_state * t] += g[n] * xv * d;
                        dx += g[n] * bn * d;
                        g[n] *= decay;
                    }
                    let at = i + d_inner * (t + n_t * s);
                    out.add(off_x + at).write(dx as f32);
                    out.add(off_dt + at)
                        .write((d_delta * softplus_grad(raw)) as f32);
                }
            }
            for n in 0..d_state {
                let at = n + d_state * (i + d_inner * s);
                // SAFETY: sequence s's slots of the state's and A's gradients are this thread's.
                unsafe {
                    out.add(at).write(g[n] as f32);
                    out.add(off_a + at).write(da[n] as f32);
                }
            }
        }
        for k in 0..d_state * n_t {
            let at = k + d_state * n_t * s;
            // SAFETY: sequence s's slots of B's and C's gradients are this thread's.
            unsafe {
                out.add(off_b + at).write(db[k] as f32);
                out.add(off_c + at).write(dc[k] as f32);
            }
        }
    }
}
