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
    /// Attention heads.
    pub n_head: u64,
    /// Width of the feed-forward layer.
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
        };
        // The architecture's own checks (experts only where it has a mixture form; their
        // counts within the limits).
        tinynn_models::arch::Hparams::from_config(&config, false)
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
    for kv in tok.gguf().metadata() {
        if kv.key.starts_with("tokenizer.") {
            m.push((kv.key.clone(), kv.value.clone()));
        }
    }
    m
}
