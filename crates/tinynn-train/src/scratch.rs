//! Training from scratch: the JSON model config `tnn train --config` reads, checked into a typed
//! [`ModelConfig`], and the GGUF metadata (hyperparameters and a tokenizer file's
//! `tokenizer.*` keys) written into the model it exports.

use serde::Deserialize;
use tinynn_format::gguf::{GgufFile, GgufString, Value};
use tinynn_format::model_config::{Architecture, Experts, ModelConfig, RopeScaling, MAX_EXPERTS};
use tinynn_models::arch;

use crate::error::{Result, TrainError};

/// A model to train from scratch, as `tnn train --config` reads it (JSON). Unknown fields are
/// refused.
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ScratchConfig {
    #[serde(default = "llama")]
    /// An architecture the registry lets train (`tinynn_models::arch`); default "llama".
    pub architecture: String,
    /// Width of the residual stream.
    pub n_embd: u64,
    /// Blocks.
    pub n_layer: u64,
    /// Attention heads (required, except for Mamba, which has none).
    #[serde(default)]
    pub n_head: u64,
    /// Width of the feed-forward layer (required, except for Mamba, which has none).
    #[serde(default)]
    pub n_ff: u64,
    /// Key/value heads (default `n_head`).
    pub n_head_kv: Option<u64>,
    /// Size of one head (default `n_embd / n_head`).
    pub head_dim: Option<u64>,
    #[serde(default = "n_ctx")]
    /// Trained context (default 2048).
    pub n_ctx: u64,
    /// Vocabulary size (default: the tokenizer's).
    pub n_vocab: Option<u64>,
    #[serde(default = "eps")]
    /// RMSNorm epsilon (default 1e-5).
    pub norm_eps: f64,
    #[serde(default = "base")]
    /// RoPE base (default 10000).
    pub rope_freq_base: f64,
    #[serde(default = "yes")]
    /// Output head tied to the embedding (default true).
    pub tie_word_embeddings: bool,
    /// Experts of a mixture-of-experts feed-forward (Mixtral-style, the Llama family only;
    /// default: a dense feed-forward).
    pub n_expert: Option<u64>,
    /// Experts each token is routed to (required with `n_expert`).
    pub n_expert_used: Option<u64>,
    /// Mamba: scan state per channel (default 16).
    pub ssm_state: Option<u64>,
    /// Mamba: width of the causal convolution (default 4).
    pub ssm_conv: Option<u64>,
    /// Mamba: channels of the mixer (default `2 · n_embd`).
    pub ssm_inner: Option<u64>,
    /// Mamba: rank of the time-step projection (default `ceil(n_embd / 16)`).
    pub ssm_dt_rank: Option<u64>,
}

fn llama() -> String {
    "llama".into()
}
fn n_ctx() -> u64 {
    2048
}
fn eps() -> f64 {
    1e-5
}
fn base() -> f64 {
    10000.0
}
fn yes() -> bool {
    true
}

impl ScratchConfig {
    /// The typed config, checked: a trainable architecture, sizes ≥ 1, `n_head` a multiple of
    /// `n_head_kv`; `n_vocab` is the tokenizer's size, used when the config gives none.
    pub fn model_config(&self, n_vocab: u64) -> Result<ModelConfig> {
        if !arch::by_name(&self.architecture).is_some_and(|a| a.train) {
            return Err(TrainError::Invalid(format!(
                "architecture '{}' cannot be trained ({})",
                self.architecture,
                arch::names(|a| a.train)
            )));
        }
        let architecture = Architecture::from_gguf_name(&self.architecture);
        if architecture == Architecture::Mamba {
            return self.mamba_config(n_vocab);
        }
        let ssm_given = [
            self.ssm_state,
            self.ssm_conv,
            self.ssm_inner,
            self.ssm_dt_rank,
        ];
        if ssm_given.iter().any(Option::is_some) {
            return Err(TrainError::Invalid(format!(
                "ssm_* settings are for Mamba, not {}",
                self.architecture
            )));
        }
        if self.n_head == 0 || self.n_embd == 0 || self.n_layer == 0 || self.n_ff == 0 {
            return Err(TrainError::Invalid(
                "n_embd, n_layer, n_head and n_ff must be at least 1".into(),
            ));
        }
        let n_head_kv = self.n_head_kv.unwrap_or(self.n_head);
        if n_head_kv == 0 || !self.n_head.is_multiple_of(n_head_kv) {
            return Err(TrainError::Invalid(format!(
                "n_head {} is not a multiple of n_head_kv {n_head_kv}",
                self.n_head
            )));
        }
        let experts = match (self.n_expert, self.n_expert_used) {
            (None, None) => None,
            (Some(count), Some(used)) => {
                if !(2..=MAX_EXPERTS).contains(&count) || used == 0 || used > count {
                    return Err(TrainError::Invalid(format!(
                        "n_expert {count} must be 2 to {MAX_EXPERTS}, and n_expert_used {used} 1 to n_expert"
                    )));
                }
                Some(Experts { count, used })
            }
            _ => {
                return Err(TrainError::Invalid(
                    "n_expert and n_expert_used go together (a mixture of experts needs both)"
                        .into(),
                ))
            }
        };
        let config = ModelConfig {
            architecture,
            n_vocab: Some(self.n_vocab.unwrap_or(n_vocab)),
            n_ctx_train: Some(self.n_ctx),
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_head: self.n_head,
            n_head_kv,
            head_dim: self.head_dim.unwrap_or(self.n_embd / self.n_head),
            n_ff: Some(self.n_ff),
            norm_eps: Some(self.norm_eps),
            rope_dims: None,
            rope_freq_base: Some(self.rope_freq_base),
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: Some(self.tie_word_embeddings),
            parallel_residual: None,
            attn: Default::default(),
            experts,
            ssm: None,
        };
        // The architecture's own checks (experts only where it has a mixture form; their
        // counts within the limits).
        tinynn_models::arch::Hparams::from_config(&config, false)
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        Ok(config)
    }
}

impl ScratchConfig {
    /// A Mamba model's config: no heads, feed-forward or experts; the SSM sizes or their
    /// defaults, checked by the config's own limits.
    fn mamba_config(&self, n_vocab: u64) -> Result<ModelConfig> {
        if self.n_embd == 0 || self.n_layer == 0 {
            return Err(TrainError::Invalid(
                "n_embd and n_layer must be at least 1".into(),
            ));
        }
        let attention = [self.n_head, self.n_ff];
        if attention.iter().any(|&v| v != 0)
            || self.n_head_kv.is_some()
            || self.head_dim.is_some()
            || self.n_expert.is_some()
            || self.n_expert_used.is_some()
        {
            return Err(TrainError::Invalid(
                "Mamba has no attention, feed-forward or experts: leave out n_head, n_head_kv, head_dim, n_ff and n_expert*"
                    .into(),
            ));
        }
        let ssm = tinynn_format::model_config::Ssm {
            conv_kernel: self.ssm_conv.unwrap_or(4),
            inner_size: self.ssm_inner.unwrap_or(self.n_embd.saturating_mul(2)),
            state_size: self.ssm_state.unwrap_or(16),
            time_step_rank: self.ssm_dt_rank.unwrap_or(self.n_embd.div_ceil(16)),
        };
        let config = ModelConfig {
            architecture: Architecture::Mamba,
            n_vocab: Some(self.n_vocab.unwrap_or(n_vocab)),
            n_ctx_train: Some(self.n_ctx),
            n_embd: self.n_embd,
            n_layer: self.n_layer,
            n_head: 0,
            n_head_kv: 0,
            head_dim: 0,
            n_ff: None,
            norm_eps: Some(self.norm_eps),
            rope_dims: None,
            rope_freq_base: None,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: Some(self.tie_word_embeddings),
            parallel_residual: None,
            attn: Default::default(),
            experts: None,
            ssm: Some(ssm),
        };
        config
            .checked()
            .map_err(|e| TrainError::Invalid(e.to_string()))?;
        Ok(config)
    }
}

/// GGUF metadata for an export: the config's hyperparameters and the tokenizer file's
/// `tokenizer.*` keys.
pub fn export_metadata(c: &ModelConfig, tok: &GgufFile) -> Vec<(String, Value)> {
    let arch = c.architecture.name().to_string();
    let mut m = vec![
        (
            "general.architecture".to_string(),
            Value::String(GgufString::from(arch.as_str())),
        ),
        (
            "general.name".to_string(),
            Value::String(GgufString::from("tinynn model")),
        ),
    ];
    let key = |k: &str| format!("{arch}.{k}");
    if let Some(x) = c.ssm {
        for (k, v) in [
            ("block_count", c.n_layer),
            ("context_length", c.n_ctx_train.unwrap_or(1 << 20)),
            ("embedding_length", c.n_embd),
            ("feed_forward_length", 0),
            ("attention.head_count", 0),
            ("vocab_size", c.n_vocab.unwrap_or(0)),
            ("ssm.conv_kernel", x.conv_kernel),
            ("ssm.inner_size", x.inner_size),
            ("ssm.state_size", x.state_size),
            ("ssm.time_step_rank", x.time_step_rank),
        ] {
            m.push((key(k), Value::U32(v as u32)));
        }
        m.push((
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(c.norm_eps.unwrap_or(1e-5) as f32),
        ));
        m.extend(tokenizer_keys(tok));
        return m;
    }
    for (k, v) in [
        ("block_count", c.n_layer),
        ("context_length", c.n_ctx_train.unwrap_or(2048)),
        ("embedding_length", c.n_embd),
        ("feed_forward_length", c.n_ff.unwrap_or(0)),
        ("attention.head_count", c.n_head),
        ("attention.head_count_kv", c.n_head_kv),
        ("attention.key_length", c.head_dim),
        ("attention.value_length", c.head_dim),
        ("vocab_size", c.n_vocab.unwrap_or(0)),
    ] {
        m.push((key(k), Value::U32(v as u32)));
    }
    if let Some(x) = c.experts {
        m.push((key("expert_count"), Value::U32(x.count as u32)));
        m.push((key("expert_used_count"), Value::U32(x.used as u32)));
    }
    m.push((
        key("attention.layer_norm_rms_epsilon"),
        Value::F32(c.norm_eps.unwrap_or(1e-5) as f32),
    ));
    m.push((
        key("rope.freq_base"),
        Value::F32(c.rope_freq_base.unwrap_or(10000.0) as f32),
    ));
    m.extend(tokenizer_keys(tok));
    m
}

/// The `tokenizer.*` keys of a tokenizer file.
fn tokenizer_keys(tok: &GgufFile) -> Vec<(String, Value)> {
    tok.gguf()
        .metadata()
        .iter()
        .filter(|kv| kv.key.starts_with("tokenizer."))
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}
