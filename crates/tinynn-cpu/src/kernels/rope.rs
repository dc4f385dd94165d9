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

/// Largest half rotation size whose sines and cosines are kept per token.
const MAX_HALF: usize = 256;

/// What a token's rotation table depends on: every layer's RoPE step of one token has the
/// same key, so the table is built once a token per thread instead of once a step.
#[derive(Clone, Copy, PartialEq)]
struct TableKey {
    rope: Rope,
    position: i32,
    inverse: bool,
    strict: bool,
    /// The frequency divisors, when the step has them (`n_dims/2` values; the rest zero).
    factors: Option<[f32; MAX_HALF]>,
}

/// One thread's last rotation table: `(sin, cos)` (already scaled) for each pair.
struct Table {
    key: Option<TableKey>,
    pairs: [(f32, f32); MAX_HALF],
}

thread_local! {
    static TABLE: std::cell::RefCell<Table> = const {
        std::cell::RefCell::new(Table { key: None, pairs: [(0.0, 0.0); MAX_HALF] })
    };
}

/// The angles of one RoPE step, as ggml builds them.
struct Angles<'a> {
    r: &'a Rope,
    factors: Option<*const f32>,
    inverse: bool,
    strict: bool,
    theta_scale: f32,
    low: f32,
    high: f32,
    mscale: f32,
}

impl Angles<'_> {
    fn new<'a>(
        r: &'a Rope,
        factors: Option<*const f32>,
        inverse: bool,
        strict: bool,
    ) -> Angles<'a> {
        let (low, high) = if r.ext_factor != 0.0 {
            let start = corr_dim(r.n_dims, r.n_ctx_orig, r.beta_fast, r.freq_base).floor();
            let end = corr_dim(r.n_dims, r.n_ctx_orig, r.beta_slow, r.freq_base).ceil();
            (start.max(0.0), end.min(r.n_dims as f32 - 1.0))
        } else {
            (0.0, 0.0)
        };
        let mscale = if r.ext_factor != 0.0 {
            r.attn_factor * (1.0 + 0.1 * (1.0 / r.freq_scale).ln())
        } else {
            r.attn_factor
        };
        Angles {
            r,
            factors,
            inverse,
            strict,
            theta_scale: r.freq_base.powf(-2.0 / r.n_dims as f32),
            low,
            high,
            mscale,
        }
    }

    /// Calls `f(i, sin, cos)` for every pair `i < n_dims/2` of a token at `position`.
    fn each(&self, position: i32, mut f: impl FnMut(usize, f32, f32)) {
        let r = self.r;
        let mut theta_base = position as f32;
        for i in 0..r.n_dims / 2 {
            // SAFETY: i < n_dims/2, the length of the factors (builder-checked).
            let factor = self.factors.map_or(1.0, |f| unsafe { f.add(i).read() });
            let extrap = theta_base / factor;
            let interp = r.freq_scale * extrap;
            let theta = if r.ext_factor != 0.0 {
                let mix = ramp(self.low, self.high, 2 * i) * r.ext_factor;
                interp * (1.0 - mix) + extrap * mix
            } else {
                interp
            };
            let mscale = self.mscale;
            let (s, c) = if self.strict {
                // Reference mode: the angle straight from the formula, in f64.
                let exact = f64::from(position)
                    * f64::from(r.freq_base).powf(-2.0 * i as f64 / r.n_dims as f64)
                    / f64::from(factor);
                let exact = if r.ext_factor != 0.0 {
                    let mix = f64::from(ramp(self.low, self.high, 2 * i) * r.ext_factor);
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
            f(i, if self.inverse { -s } else { s }, c);
            theta_base *= self.theta_scale;
        }
    }

    fn key(&self, position: i32) -> TableKey {
        let factors = self.factors.map(|f| {
            let mut v = [0f32; MAX_HALF];
            for (i, slot) in v.iter_mut().enumerate().take(self.r.n_dims / 2) {
                // SAFETY: i < n_dims/2, the length of the factors (builder-checked).
                *slot = unsafe { f.add(i).read() };
            }
            v
        });
        TableKey {
            rope: *self.r,
            position,
            inverse: self.inverse,
            strict: self.strict,
            factors,
        }
    }
}

/// Rotates the first `n_dims` values of a row by `pair(i) = (sin, cos)` and copies the rest.
///
/// # Safety
/// `xin` and `out` point to `head_dim` f32s (they may be equal).
unsafe fn rotate(
    r: &Rope,
    head_dim: usize,
    xin: *const f32,
    out: *mut f32,
    i: usize,
    s: f32,
    c: f32,
) {
    let half = r.n_dims / 2;
    let (i0, i1) = match r.mode {
        RopeMode::Normal => (2 * i, 2 * i + 1),
        RopeMode::Neox => (i, i + half),
    };
    debug_assert!(i1 < head_dim);
    // SAFETY: i0, i1 < n_dims ≤ head_dim (caller); in place each pair is read before it is
    // written.
    unsafe {
        let (x0, x1) = (xin.add(i0).read(), xin.add(i1).read());
        out.add(i0).write(x0 * c - x1 * s);
        out.add(i1).write(x0 * s + x1 * c);
    }
}

/// `inverse`: rotate by the negative angle (the gradient of the forward rotation).
pub(crate) fn rope(
    r: &Rope,
    has_freq_factors: bool,
    inverse: bool,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (x, pos) = (a.src(0), a.src(1));
    let factors = has_freq_factors.then(|| a.src(2).row_f32_ptr(0, 0, 0).cast_const());
    let dst = a.dst;
    let [head_dim, n_head, n_tok, _] = dst.layout.ne;
    // SAFETY: positions are a contiguous I32 [n_tok] tensor (builder-checked).
    let positions = unsafe { pos.i32s() };
    if positions.len() != n_tok {
        a.errors.record(ERR_KERNEL, 0);
        return;
    }
    let angles = Angles::new(r, factors, inverse, a.strict);
    let half = r.n_dims / 2;
    let copy_rest = |xin: *const f32, out: *mut f32| {
        for j in r.n_dims..head_dim {
            // SAFETY: j < head_dim of both rows.
            unsafe { out.add(j).write(xin.add(j).read()) };
        }
    };
    if half > MAX_HALF {
        for row in split(n_head * n_tok, ctx.ith, ctx.nth) {
            let (h, t) = (row % n_head, row / n_head);
            // Contiguous F32 rows; this thread's row.
            let (xin, out) = (
                x.row_f32_ptr(h, t, 0).cast_const(),
                dst.row_f32_ptr(h, t, 0),
            );
            // SAFETY: rows of head_dim f32s.
            angles.each(positions[t], |i, s, c| unsafe {
                rotate(r, head_dim, xin, out, i, s, c)
            });
            copy_rest(xin, out);
        }
        return;
    }
    // The rotation of a token is the same for every head and every layer: kept per thread
    // and rebuilt when the token (or the settings) change.
    TABLE.with_borrow_mut(|table| {
        let mut table_token = usize::MAX;
        for row in split(n_head * n_tok, ctx.ith, ctx.nth) {
            let (h, t) = (row % n_head, row / n_head);
            if table_token != t {
                let key = angles.key(positions[t]);
                if table.key != Some(key) {
                    angles.each(positions[t], |i, s, c| table.pairs[i] = (s, c));
                    table.key = Some(key);
                }
                table_token = t;
            }
            // Contiguous F32 rows; this thread's row; in place each pair is read before it
            // is written.
            let (xin, out) = (
                x.row_f32_ptr(h, t, 0).cast_const(),
                dst.row_f32_ptr(h, t, 0),
            );
            for (i, &(s, c)) in table.pairs[..half].iter().enumerate() {
                // SAFETY: rows of head_dim f32s.
                unsafe { rotate(r, head_dim, xin, out, i, s, c) };
            }
            copy_rest(xin, out);
        }
    });
}
