//! Rotary position embedding (ggml's `rope_ext`): normal (adjacent pairs) and NEOX (halves)
//! modes, partial rotation, linear scaling, YaRN, and per-dimension frequency factors.
//! Angles are built as ggml builds them: `theta_i = pos * base^(-2i/n_dims)`, the power taken by
//! repeated f32 multiplication.

use tinynn_core::ops::{Rope, RopeMode};

use super::{split, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;

/// The dimension at which a frequency completes `n_rot` rotations over the original context.
fn corr_dim(n_dims: usize, n_ctx_orig: usize, n_rot: f32, base: f32) -> f32 {
    n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
        / (2.0 * base.ln())
}

/// YaRN's ramp between interpolation (0) and extrapolation (1) for pair index `i0/2`.
fn ramp(low: f32, high: f32, i0: usize) -> f32 {
    let y = (i0 as f32 / 2.0 - low) / (high - low).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// `inverse`: rotate by the negative angle (the gradient of the forward rotation).
/// Largest half rotation size whose sines and cosines are kept per token.
const MAX_HALF: usize = 256;

pub(crate) fn rope(
    r: &Rope,
    has_freq_factors: bool,
    inverse: bool,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (x, pos) = (a.src(0), a.src(1));
    let factors = has_freq_factors.then(|| a.src(2).row_f32_ptr(0, 0, 0));
    let dst = a.dst;
    let [head_dim, n_head, n_tok, _] = dst.layout.ne;
    // SAFETY: positions are a contiguous I32 [n_tok] tensor (builder-checked).
    let positions = unsafe { pos.i32s() };
    if positions.len() != n_tok {
        a.errors.record(ERR_KERNEL, 0);
        return;
    }
    let theta_scale = r.freq_base.powf(-2.0 / r.n_dims as f32);
    let (low, high) = if r.ext_factor != 0.0 {
        let start = corr_dim(r.n_dims, r.n_ctx_orig, r.beta_fast, r.freq_base).floor();
        let end = corr_dim(r.n_dims, r.n_ctx_orig, r.beta_slow, r.freq_base).ceil();
        (start.max(0.0), end.min(r.n_dims as f32 - 1.0))
    } else {
        (0.0, 0.0)
    };
    let mscale_base = if r.ext_factor != 0.0 {
        r.attn_factor * (1.0 + 0.1 * (1.0 / r.freq_scale).ln())
    } else {
        r.attn_factor
    };
    let half = r.n_dims / 2;
    // The rotation of a token is the same for every head: computed once per token (rows of
    // one token are consecutive), then applied.
    let mut table = [(0f32, 0f32); MAX_HALF];
    let mut table_token = usize::MAX;
    let cached = half <= MAX_HALF;
    for row in split(n_head * n_tok, ctx.ith, ctx.nth) {
        let (h, t) = (row % n_head, row / n_head);
        // Contiguous F32 rows; this thread's row; in place each pair is read before it is written.
        let (xin, out) = (x.row_f32_ptr(h, t, 0), dst.row_f32_ptr(h, t, 0));
        if cached && table_token == t {
            for (i, &(s, c)) in table[..half].iter().enumerate() {
                let (i0, i1) = match r.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                // SAFETY: i0, i1 < n_dims ≤ head_dim of contiguous F32 rows; in place each pair
                // is read before it is written.
                unsafe {
                    let (x0, x1) = (xin.add(i0).read(), xin.add(i1).read());
                    out.add(i0).write(x0 * c - x1 * s);
                    out.add(i1).write(x0 * s + x1 * c);
                }
            }
            for j in r.n_dims..head_dim {
                // SAFETY: j < head_dim.
                unsafe { out.add(j).write(xin.add(j).read()) };
            }
            continue;
        }
        table_token = if cached { t } else { usize::MAX };
        let mut theta_base = positions[t] as f32;
        for i in 0..half {
            // SAFETY: i < n_dims/2, the length of the factors (builder-checked).
            let factor = factors.map_or(1.0, |f| unsafe { f.add(i).read() });
            let extrap = theta_base / factor;
            let interp = r.freq_scale * extrap;
            let (theta, mscale) = if r.ext_factor != 0.0 {
                let mix = ramp(low, high, 2 * i) * r.ext_factor;
                (interp * (1.0 - mix) + extrap * mix, mscale_base)
            } else {
                (interp, mscale_base)
            };
            let (s, c) = if a.strict {
                // Reference mode: the angle straight from the formula, in f64.
                let exact = f64::from(positions[t])
                    * f64::from(r.freq_base).powf(-2.0 * i as f64 / r.n_dims as f64)
                    / f64::from(factor);
                let exact = if r.ext_factor != 0.0 {
                    let mix = f64::from(ramp(low, high, 2 * i) * r.ext_factor);
                    exact * f64::from(r.freq_scale) * (1.0 - mix) + exact * mix
                } else {
                    exact * f64::from(r.freq_scale)
                };
                let (s, c) = exact.sin_cos();
                (
                    (s * f64::from(mscale)) as f32,
                    (c * f64::from(mscale)) as f32,
                )
            } else {
                let (s, c) = theta.sin_cos();
                (s * mscale, c * mscale)
            };
            let s = if inverse { -s } else { s };
            if let Some(slot) = table.get_mut(i).filter(|_| cached) {
                *slot = (s, c);
            }
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
            theta_base *= theta_scale;
        }
        for j in r.n_dims..head_dim {
            // SAFETY: j < head_dim.
            unsafe { out.add(j).write(xin.add(j).read()) };
        }
    }
}
