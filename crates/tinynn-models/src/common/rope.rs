//! Rotary position embeddings: the parameters a config asks for (mode, rotated dims, base,
//! linear / YaRN / Llama 3 scaling), and their application to q or k.

use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::{ModelConfig, RopeScaling};

use crate::{ModelError, Result};

/// RoPE's run-time inputs, shared by every layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RopeInputs {
    /// I32 `[n]`: each token's position in its sequence.
    pub pos: TensorId,
    /// F32 `[n_dims/2]`: frequency divisors per rotated pair (Llama 3 scaling), when any.
    pub freqs: Option<TensorId>,
}

impl RopeInputs {
    /// `x` (`[head_dim, heads, n]`) rotated at the tokens' positions: the same shape.
    pub fn apply(&self, g: &mut Graph, x: TensorId, rope: Rope) -> Result<TensorId> {
        Ok(g.rope_ext(x, self.pos, self.freqs, rope)?)
    }
}

/// The RoPE parameters of `c` in `mode`, and Llama 3's frequency divisors when its scaling
/// asks for them.
pub fn rope_params(c: &ModelConfig, mode: RopeMode) -> Result<(Rope, Option<Vec<f32>>)> {
    let head_dim = c.head_dim as usize;
    let mut rope = Rope::new(
        mode,
        c.rope_dims.map_or(head_dim, |d| d as usize),
        c.rope_freq_base.unwrap_or(10_000.0) as f32,
    );
    match &c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } if *factor > 0.0 => rope.freq_scale = (1.0 / factor) as f32,
        // Llama 3: per-dimension frequency divisors (computed in `llama3_freq_factors`).
        RopeScaling::Llama3 { .. } => {}
        // LongRoPE: divisors per pair (see `longrope_factors`), cos/sin scaled.
        RopeScaling::LongRope {
            original_context,
            attn_factor,
            ..
        } => rope.attn_factor = longrope_attn_factor(c, *original_context, *attn_factor) as f32,
        // YaRN: interpolate low frequencies, extrapolate high ones, scale cos/sin.
        RopeScaling::Yarn {
            factor,
            original_context,
            attn_factor,
            beta_fast,
            beta_slow,
        } if *factor > 0.0 => {
            rope.freq_scale = (1.0 / factor) as f32;
            rope.ext_factor = 1.0;
            rope.attn_factor = attn_factor.unwrap_or(1.0) as f32;
            rope.beta_fast = beta_fast.unwrap_or(32.0) as f32;
            rope.beta_slow = beta_slow.unwrap_or(1.0) as f32;
            rope.n_ctx_orig = original_context.or(c.n_ctx_train).unwrap_or(4096) as usize;
        }
        other => {
            return Err(ModelError::Invalid(format!(
                "RoPE scaling {other:?} is not supported yet"
            )))
        }
    }
    let freq_factors = match c.rope_scaling {
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } => Some(llama3_freq_factors(
            rope.n_dims,
            f64::from(rope.freq_base),
            factor,
            low_freq_factor.unwrap_or(1.0),
            high_freq_factor.unwrap_or(4.0),
            original_context.unwrap_or(8192) as f64,
        )),
        RopeScaling::LongRope {
            short_factor: Some(ref f),
            ..
        } => Some(longrope_factors(f, rope.n_dims, "short_factor")?),
        _ => None,
    };
    Ok((rope, freq_factors))
}

/// LongRoPE's cos/sin scale: the config's, else `sqrt(1 + ln(s) / ln(original))` for the
/// stretch `s = n_ctx_train / original` (1 when `s ≤ 1`), as transformers computes it.
fn longrope_attn_factor(c: &ModelConfig, original: Option<u64>, given: Option<f64>) -> f64 {
    if let Some(f) = given {
        return f;
    }
    let (Some(original), Some(n_ctx)) = (original, c.n_ctx_train) else {
        return 1.0;
    };
    let s = n_ctx as f64 / original as f64;
    if s <= 1.0 || original < 2 {
        1.0
    } else {
        (1.0 + s.ln() / (original as f64).ln()).sqrt()
    }
}

/// LongRoPE divisors `f` (one per rotated pair of `n_dims`) as f32; `what` names them in
/// errors.
pub fn longrope_factors(f: &[f64], n_dims: usize, what: &str) -> Result<Vec<f32>> {
    if f.len() != n_dims / 2 || f.iter().any(|x| !x.is_finite() || *x <= 0.0) {
        return Err(ModelError::Invalid(format!(
            "LongRoPE {what} has {} values; RoPE turns {} pairs and each factor must be finite              and positive",
            f.len(),
            n_dims / 2
        )));
    }
    Ok(f.iter().map(|&x| x as f32).collect())
}

/// Llama 3's frequency divisors: 1 for short wavelengths, `factor` for long ones, a smooth
/// blend between (as transformers' `_compute_llama3_parameters` and llama.cpp's converter).
pub fn llama3_freq_factors(
    n_dims: usize,
    base: f64,
    factor: f64,
    low: f64,
    high: f64,
    old_ctx: f64,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..n_dims / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / n_dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}
