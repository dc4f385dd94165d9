//! Hugging Face `config.json`, the fields of the Llama, Qwen2/3, Mistral, Gemma and GPT-2
//! families. Unknown fields are ignored; wrong types are errors that name line and column.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// A token id or a list of them (`eos_token_id` is either in real configs).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TokenIds {
    One(i64),
    Many(Vec<i64>),
}

/// `rope_scaling` (`type` in older configs, `rope_type` in newer ones).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct HfRopeScaling {
    pub rope_type: Option<String>,
    #[serde(rename = "type")]
    pub legacy_type: Option<String>,
    pub factor: Option<f64>,
    pub original_max_position_embeddings: Option<u64>,
    pub low_freq_factor: Option<f64>,
    pub high_freq_factor: Option<f64>,
    pub beta_fast: Option<f64>,
    pub beta_slow: Option<f64>,
    pub attention_factor: Option<f64>,
    pub short_factor: Option<Vec<f64>>,
    pub long_factor: Option<Vec<f64>>,
    /// transformers ≥ 5 keeps the base frequency here (`rope_parameters`).
    pub rope_theta: Option<f64>,
    /// transformers ≥ 5 keeps GPT-NeoX's rotated fraction here too.
    pub partial_rotary_factor: Option<f64>,
    /// transformers ≥ 5, models with two kinds of layers (Gemma 3): the settings of the
    /// global layers and of the sliding-window layers.
    pub full_attention: Option<Box<HfRopeScaling>>,
    pub sliding_attention: Option<Box<HfRopeScaling>>,
}

impl HfRopeScaling {
    /// The scaling kind, whichever spelling the config used.
    pub fn kind(&self) -> Option<&str> {
        self.rope_type.as_deref().or(self.legacy_type.as_deref())
    }
}

/// The subset of `config.json` tinynn understands.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
pub struct HfConfig {
    pub model_type: Option<String>,
    pub architectures: Option<Vec<String>>,
    // Llama / Mistral / Qwen / Gemma names.
    pub vocab_size: Option<u64>,
    pub hidden_size: Option<u64>,
    pub intermediate_size: Option<u64>,
    pub num_hidden_layers: Option<u64>,
    pub num_attention_heads: Option<u64>,
    pub num_key_value_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub max_position_embeddings: Option<u64>,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<HfRopeScaling>,
    /// transformers ≥ 5: `rope_theta` and the scaling settings in one object.
    pub rope_parameters: Option<HfRopeScaling>,
    pub partial_rotary_factor: Option<f64>,
    pub tie_word_embeddings: Option<bool>,
    // GPT-NeoX names.
    /// The fraction of each head RoPE turns (older configs; newer ones say
    /// `partial_rotary_factor`).
    pub rotary_pct: Option<f64>,
    pub rotary_emb_base: Option<f64>,
    pub use_parallel_residual: Option<bool>,
    // Mixtral names.
    /// Experts of each mixture-of-experts feed-forward.
    pub num_local_experts: Option<u64>,
    /// Experts each token is routed to.
    pub num_experts_per_tok: Option<u64>,
    // Mamba names.
    /// The selective scan's state per channel.
    pub state_size: Option<u64>,
    /// The depthwise convolution's width.
    pub conv_kernel: Option<u64>,
    /// `intermediate_size = expand · hidden_size` when the config gives no intermediate size.
    pub expand: Option<u64>,
    /// Rank of the time-step projection: a number, or `"auto"` (`ceil(hidden_size / 16)`).
    pub time_step_rank: Option<TimeStepRank>,
    // Phi-3 names.
    /// The context LongRoPE's short factors serve (top level in Phi-3 configs).
    pub original_max_position_embeddings: Option<u64>,
    pub layer_norm_eps: Option<f64>,
    pub attention_bias: Option<bool>,
    pub hidden_act: Option<String>,
    pub hidden_activation: Option<String>,
    pub sliding_window: Option<u64>,
    /// Gemma 3 (older configs): of every n layers, the last is global.
    pub sliding_window_pattern: Option<u64>,
    /// Per layer: `"sliding_attention"` or `"full_attention"`.
    pub layer_types: Option<Vec<String>>,
    /// Gemma 3 (transformers < 5): RoPE base of the sliding-window layers.
    pub rope_local_base_freq: Option<f64>,
    pub query_pre_attn_scalar: Option<f64>,
    pub attn_logit_softcapping: Option<f64>,
    pub final_logit_softcapping: Option<f64>,
    pub bos_token_id: Option<TokenIds>,
    pub eos_token_id: Option<TokenIds>,
    pub pad_token_id: Option<TokenIds>,
    pub torch_dtype: Option<String>,
    pub dtype: Option<String>,
    // GPT-2 names.
    pub n_embd: Option<u64>,
    pub n_layer: Option<u64>,
    pub n_head: Option<u64>,
    pub n_inner: Option<u64>,
    pub n_positions: Option<u64>,
    pub n_ctx: Option<u64>,
    pub layer_norm_epsilon: Option<f64>,
    pub activation_function: Option<String>,
}

/// Mamba's `time_step_rank`: a number or `"auto"`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum TimeStepRank {
    Rank(u64),
    /// `"auto"`: `ceil(hidden_size / 16)`.
    Auto(String),
}

impl HfConfig {
    pub fn from_json(text: &str) -> std::result::Result<HfConfig, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// Reads `config.json`; the error names the file, line and column.
    pub fn from_file(path: &Path) -> Result<HfConfig> {
        let text = crate::model_dir::read_small_text(path)?;
        HfConfig::from_json(&text).map_err(|e| Error::json(path, &e))
    }

    /// `rope_parameters`, or its global layers' part when it has one per layer type.
    fn rope_parameters_global(&self) -> Option<&HfRopeScaling> {
        let p = self.rope_parameters.as_ref()?;
        Some(p.full_attention.as_deref().unwrap_or(p))
    }

    /// RoPE's base frequency (of the global layers), wherever the config keeps it.
    pub fn rope_theta(&self) -> Option<f64> {
        self.rope_theta
            .or_else(|| self.rope_parameters_global().and_then(|p| p.rope_theta))
            .or(self.rotary_emb_base)
    }

    /// The fraction of each head RoPE turns, wherever the config keeps it.
    pub fn partial_rotary(&self) -> Option<f64> {
        self.partial_rotary_factor
            .or_else(|| {
                self.rope_parameters_global()
                    .and_then(|p| p.partial_rotary_factor)
            })
            .or(self.rotary_pct)
    }

    /// RoPE's base frequency of the sliding-window layers, when `rope_parameters` has one.
    pub fn rope_theta_swa(&self) -> Option<f64> {
        let p = self
            .rope_parameters
            .as_ref()?
            .sliding_attention
            .as_deref()?;
        p.rope_theta
    }

    /// RoPE scaling settings (of the global layers), wherever the config keeps them.
    pub fn rope_scaling(&self) -> Option<&HfRopeScaling> {
        self.rope_scaling
            .as_ref()
            .or_else(|| self.rope_parameters_global())
    }

    /// The weights' dtype as the config states it (`torch_dtype`, or `dtype` in newer files).
    pub fn weight_dtype(&self) -> Option<&str> {
        self.torch_dtype.as_deref().or(self.dtype.as_deref())
    }
}
