//! The numbers a decoder graph needs, derived from a [`ModelConfig`] for a registered
//! architecture (`super::REGISTRY`).

use tinynn_core::ops::{Rope, RopeMode};
use tinynn_format::model_config::ModelConfig;

use crate::common::rope::rope_params;
use crate::{ModelError, Result};

/// The numbers the graph needs, derived from the config.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaHparams {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub norm_eps: f32,
    pub rope: Rope,
    /// Frequency divisors per rotated pair (Llama 3 scaling), when the config asks for them.
    pub freq_factors: Option<Vec<f32>>,
}

impl LlamaHparams {
    /// `hf_layout`: weights as transformers stores them (RoPE on halves); GGUF files of
    /// architectures whose q/k rows llama.cpp permutes (`Arch::gguf_qk_permuted`) rotate
    /// adjacent pairs instead. An architecture missing from the registry is
    /// [`ModelError::UnsupportedArchitecture`].
    pub fn from_config(c: &ModelConfig, hf_layout: bool) -> Result<LlamaHparams> {
        let arch = super::of_config(c)?;
        let mode = if arch.gguf_qk_permuted && !hf_layout {
            RopeMode::Normal
        } else {
            RopeMode::Neox
        };
        let (rope, freq_factors) = rope_params(c, mode)?;
        let missing = |what: &str| ModelError::Invalid(format!("the model config lacks {what}"));
        Ok(LlamaHparams {
            n_embd: c.n_embd as usize,
            n_layer: c.n_layer as usize,
            n_head: c.n_head as usize,
            n_head_kv: c.n_head_kv as usize,
            head_dim: c.head_dim as usize,
            n_ff: c.n_ff.ok_or_else(|| missing("the feed-forward length"))? as usize,
            n_vocab: c.n_vocab.ok_or_else(|| missing("the vocabulary size"))? as usize,
            norm_eps: c.norm_eps.unwrap_or(1e-5) as f32,
            freq_factors,
            rope,
        })
    }
}
