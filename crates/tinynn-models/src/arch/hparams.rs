//! The numbers a decoder graph needs, derived from a [`ModelConfig`] for a registered
//! architecture (`super::REGISTRY`), with the architecture's defaults for what the file leaves
//! out ([`super::Decoder::defaults`]).

use tinynn_core::ops::{Rope, RopeMode};
use tinynn_format::model_config::{ModelConfig, RopeScaling, SwaPattern};

use crate::common::rope::{longrope_factors, rope_params};
use crate::{ModelError, Result};

/// Sliding-window attention: which layers use it and how they rotate.
#[derive(Clone, Debug, PartialEq)]
pub struct SlidingWindow {
    /// A token sees itself and the `window − 1` tokens before it.
    pub window: usize,
    /// Per layer: true where the layer uses the window.
    pub layers: Vec<bool>,
    /// RoPE of the window layers (Gemma 3 rotates them with a base of its own).
    pub rope: Rope,
}

/// The numbers the graph needs, derived from the config.
#[derive(Clone, Debug, PartialEq)]
pub struct Hparams {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    /// The context the model was trained with, when the file states it (GPT-2's position
    /// table has that many rows).
    pub n_ctx_train: Option<usize>,
    pub norm_eps: f32,
    pub rope: Rope,
    /// Frequency divisors per rotated pair (Llama 3 scaling), when the config asks for them.
    pub freq_factors: Option<Vec<f32>>,
    /// Weights as transformers stores them (an HF directory), not as llama.cpp's converter
    /// rewrites them (permuted q/k rows, Gemma's norm weights stored as `1 + w`).
    pub hf_layout: bool,
    /// Attention's score scale (`1/sqrt(head_dim)` unless the model says otherwise).
    pub attn_scale: f32,
    /// Attention scores become `cap·tanh(s/cap)` (0: off).
    pub attn_softcap: f32,
    /// Logits become `cap·tanh(l/cap)`, when set.
    pub final_softcap: Option<f32>,
    /// The embeddings are multiplied by this (Gemma: `sqrt(n_embd)`).
    pub embd_scale: Option<f32>,
    /// Sliding-window layers, when the model has any.
    pub swa: Option<SlidingWindow>,
    /// Attention and feed-forward both read the block's input (GPT-NeoX's parallel residual).
    pub parallel_residual: bool,
    /// LongRoPE (Phi-3): `freq_factors` holds the short factors; these take over past the
    /// original context ([`Hparams::for_context`]).
    pub longrope: Option<LongRope>,
    /// Experts per block, 0 for a dense feed-forward.
    pub n_expert: usize,
    /// Experts each token is routed to (0 for a dense feed-forward).
    pub n_expert_used: usize,
    /// A state-space model's block sizes (Mamba); `None` for attention models.
    pub ssm: Option<SsmHparams>,
}

/// A Mamba block's sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SsmHparams {
    /// Width of the depthwise causal convolution.
    pub d_conv: usize,
    /// Channels of the mixer.
    pub d_inner: usize,
    /// Scan state per channel.
    pub d_state: usize,
    /// Rank of the time-step projection.
    pub dt_rank: usize,
}

impl SsmHparams {
    /// The state a layer keeps per sequence.
    pub fn state_dims(&self) -> crate::common::StateDims {
        crate::common::StateDims {
            d_conv: self.d_conv,
            d_inner: self.d_inner,
            d_state: self.d_state,
        }
    }
}

/// LongRoPE's context switch.
#[derive(Clone, Debug, PartialEq)]
pub struct LongRope {
    /// Contexts up to this many tokens use the short factors.
    pub original: usize,
    /// The divisors of longer contexts (`None` where a file keeps them as a tensor).
    pub long: Option<Vec<f32>>,
}

/// What an architecture assumes where a file is silent.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArchDefaults {
    /// The sliding-window period when a window is given without a pattern (0: every layer).
    pub swa_period: u64,
    /// RoPE base of the window layers when the file gives none (`None`: the global base).
    pub rope_freq_base_swa: Option<f64>,
    /// The embeddings are multiplied by `sqrt(n_embd)`.
    pub scale_embeddings: bool,
    /// The architecture has sliding-window layers; when false a window in the config is
    /// ignored (Qwen2 configs state one they do not use).
    pub sliding_window: bool,
    /// Attention's score scale when the config gives no `query_pre_attn_scalar` (`None`:
    /// `1/sqrt(head_dim)`).
    pub attn_scale: Option<fn(&ModelConfig) -> f32>,
    /// Parallel residual blocks when the file does not say (GPT-NeoX).
    pub parallel_residual: bool,
    /// The architecture's feed-forward may be a mixture of experts (the Llama family:
    /// Mixtral); when false a config with experts is refused.
    pub experts: bool,
}

impl Hparams {
    /// `hf_layout`: weights as transformers stores them (RoPE on halves); GGUF files of
    /// architectures whose q/k rows llama.cpp permutes (`Arch::gguf_qk_permuted`) rotate
    /// adjacent pairs instead. An architecture missing from the registry is
    /// [`ModelError::UnsupportedArchitecture`].
    pub fn from_config(c: &ModelConfig, hf_layout: bool) -> Result<Hparams> {
        let arch = super::of_config(c)?;
        let mode = if arch.gguf_qk_permuted && !hf_layout {
            RopeMode::Normal
        } else {
            RopeMode::Neox
        };
        let (rope, freq_factors) = rope_params(c, mode)?;
        let missing = |what: &str| ModelError::Invalid(format!("the model config lacks {what}"));
        let defaults = arch.decoder.defaults();
        let head_dim = c.head_dim as usize;
        let a = &c.attn;
        let attn_scale = match (a.query_pre_attn_scalar, defaults.attn_scale) {
            (Some(s), _) => 1.0 / (s as f32).sqrt(),
            (None, Some(f)) => f(c),
            (None, None) => 1.0 / (head_dim as f32).sqrt(),
        };
        let n_layer = c.n_layer as usize;
        if c.experts.is_some() && !defaults.experts {
            return Err(ModelError::Invalid(format!(
                "{} has no mixture-of-experts form, but the config gives experts",
                arch.name
            )));
        }
        let (n_expert, n_expert_used) = c
            .experts
            .map_or((0, 0), |x| (x.count as usize, x.used as usize));
        let window = a.sliding_window.filter(|_| defaults.sliding_window);
        let swa = match window {
            None => None,
            Some(window) => {
                let layers: Vec<bool> = match &a.swa_pattern {
                    Some(SwaPattern::Layers(l)) => l.clone(),
                    Some(SwaPattern::Period(p)) => period_layers(n_layer, *p),
                    None => period_layers(n_layer, defaults.swa_period),
                };
                let mut swa_rope = rope;
                if let Some(base) = a.rope_freq_base_swa.or(defaults.rope_freq_base_swa) {
                    // The window layers rotate without the global layers' scaling.
                    swa_rope = Rope::new(mode, rope.n_dims, base as f32);
                }
                // No layer using the window: no window.
                layers.iter().any(|&l| l).then_some(SlidingWindow {
                    window: usize::try_from(window).unwrap_or(usize::MAX),
                    layers,
                    rope: swa_rope,
                })
            }
        };
        Ok(Hparams {
            n_embd: c.n_embd as usize,
            n_layer,
            n_head: c.n_head as usize,
            n_head_kv: c.n_head_kv as usize,
            head_dim,
            n_ff: match c.ssm {
                Some(_) => 0,
                None => c.n_ff.ok_or_else(|| missing("the feed-forward length"))? as usize,
            },
            n_vocab: c.n_vocab.ok_or_else(|| missing("the vocabulary size"))? as usize,
            n_ctx_train: c
                .n_ctx_train
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            norm_eps: c.norm_eps.unwrap_or(1e-5) as f32,
            freq_factors,
            rope,
            hf_layout,
            attn_scale,
            attn_softcap: a.attn_logit_softcap.unwrap_or(0.0) as f32,
            final_softcap: a.final_logit_softcap.map(|x| x as f32),
            embd_scale: defaults.scale_embeddings.then(|| (c.n_embd as f32).sqrt()),
            swa,
            parallel_residual: c.parallel_residual.unwrap_or(defaults.parallel_residual),
            longrope: match &c.rope_scaling {
                RopeScaling::LongRope {
                    original_context,
                    long_factor,
                    ..
                } => Some(LongRope {
                    original: original_context
                        .or(c.n_ctx_train)
                        .map_or(usize::MAX, |n| usize::try_from(n).unwrap_or(usize::MAX)),
                    long: match long_factor {
                        Some(f) => Some(longrope_factors(f, rope.n_dims, "long_factor")?),
                        None => None,
                    },
                }),
                _ => None,
            },
            n_expert,
            n_expert_used,
            ssm: c.ssm.map(|x| SsmHparams {
                d_conv: x.conv_kernel as usize,
                d_inner: x.inner_size as usize,
                d_state: x.state_size as usize,
                dt_rank: x.time_step_rank as usize,
            }),
        })
    }

    /// Whether a context of `n_ctx` tokens rotates with LongRoPE's long factors (past the
    /// original context, as llama.cpp decides it for the whole context).
    pub fn uses_long_factors(&self, n_ctx: usize) -> bool {
        self.longrope.as_ref().is_some_and(|l| n_ctx > l.original)
    }

    /// Makes `freq_factors` those of a context of `n_ctx` tokens (LongRoPE's long factors
    /// past its original context; nothing changes for other models).
    pub fn for_context(&mut self, n_ctx: usize) {
        if self.uses_long_factors(n_ctx) {
            if let Some(long) = self.longrope.as_ref().and_then(|l| l.long.clone()) {
                self.freq_factors = Some(long);
            }
        }
    }

    /// Whether layer `l` attends through the sliding window.
    pub fn is_swa(&self, l: usize) -> bool {
        self.swa
            .as_ref()
            .is_some_and(|s| s.layers.get(l).copied().unwrap_or(false))
    }

    /// Whether some layer attends to the whole causal context (and so needs the plain mask):
    /// false only when every layer is a sliding-window layer (Mistral).
    pub fn has_global_layers(&self) -> bool {
        self.swa
            .as_ref()
            .is_none_or(|s| s.layers.iter().any(|&w| !w))
    }

    /// The RoPE of layer `l`.
    pub fn rope_of(&self, l: usize) -> Rope {
        match &self.swa {
            Some(s) if self.is_swa(l) => s.rope,
            _ => self.rope,
        }
    }
}

/// Layers under a period-`p` pattern: of every `p` layers all but the last use the window
/// (as llama.cpp's `set_swa_pattern`); 0: every layer does.
fn period_layers(n_layer: usize, p: u64) -> Vec<bool> {
    (0..n_layer)
        .map(|l| p == 0 || (l as u64 % p) < p - 1)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::period_layers;

    #[test]
    fn periods_mark_all_but_the_last_layer_of_each() {
        let six = period_layers(13, 6);
        let want: Vec<bool> = (0..13).map(|l| l % 6 != 5).collect();
        assert_eq!(six, want);
        assert!(period_layers(4, 0).iter().all(|&b| b));
        assert!(period_layers(4, 1).iter().all(|&b| !b));
        assert_eq!(period_layers(4, 2), vec![true, false, true, false]);
    }
}
