//! The hyperparameters of a transformer, read from GGUF metadata or a HF `config.json` into one
//! typed shape, so later layers never look at key strings.

use serde::Serialize;

use crate::error::GgufError;
use crate::gguf::{Gguf, Key};
use crate::hf_config::HfConfig;

/// Model families by their GGUF architecture name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "String")]
pub enum Architecture {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma,
    Gemma2,
    Gemma3,
    Phi3,
    Gpt2,
    GptNeox,
    Mamba,
    /// A family tinynn does not know; the name is kept as the file gives it.
    Other(String),
}

impl Architecture {
    /// From `general.architecture`.
    pub fn from_gguf_name(name: &str) -> Architecture {
        match name {
            "llama" => Architecture::Llama,
            "mistral" => Architecture::Mistral,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma" => Architecture::Gemma,
            "gemma2" => Architecture::Gemma2,
            "gemma3" => Architecture::Gemma3,
            "phi3" => Architecture::Phi3,
            "gpt2" => Architecture::Gpt2,
            "gptneox" => Architecture::GptNeox,
            "mamba" => Architecture::Mamba,
            other => Architecture::Other(other.to_string()),
        }
    }

    /// From `model_type` in `config.json` (`gemma3_text` is Gemma 3's text model).
    pub fn from_hf_model_type(model_type: &str) -> Architecture {
        match model_type {
            "gemma3_text" => Architecture::Gemma3,
            "gpt_neox" => Architecture::GptNeox,
            // llama.cpp's converter writes Mixtral as a Llama with experts.
            "mixtral" => Architecture::Llama,
            other => Architecture::from_gguf_name(other),
        }
    }

    /// The GGUF architecture name.
    pub fn name(&self) -> &str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Mistral => "mistral",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma => "gemma",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
            Architecture::Phi3 => "phi3",
            Architecture::Gpt2 => "gpt2",
            Architecture::GptNeox => "gptneox",
            Architecture::Mamba => "mamba",
            Architecture::Other(s) => s,
        }
    }
}

impl From<Architecture> for String {
    fn from(a: Architecture) -> String {
        a.name().to_string()
    }
}

/// How positions beyond the training context are handled by RoPE.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum RopeScaling {
    None,
    Linear {
        factor: f64,
    },
    Yarn {
        factor: f64,
        original_context: Option<u64>,
        attn_factor: Option<f64>,
        beta_fast: Option<f64>,
        beta_slow: Option<f64>,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: Option<f64>,
        high_freq_factor: Option<f64>,
        original_context: Option<u64>,
    },
    /// Phi-3's LongRoPE: per-pair frequency divisors for contexts up to `original_context`
    /// (`short_factor`) and beyond it (`long_factor`), and cos/sin scaled by `attn_factor`.
    /// GGUF files keep the divisors as tensors (`rope_factors_short/long.weight`).
    LongRope {
        original_context: Option<u64>,
        short_factor: Option<Vec<f64>>,
        long_factor: Option<Vec<f64>>,
        attn_factor: Option<f64>,
    },
    /// A scaling kind tinynn does not know, kept by name.
    Other {
        name: String,
    },
}

/// A transformer's shape and settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub n_vocab: Option<u64>,
    /// Context length the model was trained with.
    pub n_ctx_train: Option<u64>,
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_ff: Option<u64>,
    pub norm_eps: Option<f64>,
    pub rope_dims: Option<u64>,
    pub rope_freq_base: Option<f64>,
    pub rope_scaling: RopeScaling,
    pub tie_word_embeddings: Option<bool>,
    /// Attention and feed-forward both read the block's input and add to it (GPT-NeoX's
    /// `use_parallel_residual`); `None`: the architecture's way.
    pub parallel_residual: Option<bool>,
    /// Sliding-window attention, per-layer RoPE bases and logit soft-capping (Gemma,
    /// Mistral, Phi-3); all `None` for plain causal attention.
    pub attn: AttentionExtras,
    /// The feed-forward is a mixture of experts (Mixtral); `None`: one dense feed-forward.
    pub experts: Option<Experts>,
    /// The blocks are selective state-space mixers (Mamba), with no attention: the head
    /// counts and head dimension are then 0.
    pub ssm: Option<Ssm>,
}

/// A selective state-space (Mamba) block's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Ssm {
    /// Width of the depthwise causal convolution (`{arch}.ssm.conv_kernel`, HF `conv_kernel`).
    pub conv_kernel: u64,
    /// Channels of the mixer (`{arch}.ssm.inner_size`, HF `intermediate_size`).
    pub inner_size: u64,
    /// State per channel (`{arch}.ssm.state_size`, HF `state_size`).
    pub state_size: u64,
    /// Rank of the time-step projection (`{arch}.ssm.time_step_rank`, HF `time_step_rank`).
    pub time_step_rank: u64,
}

/// Widest convolution and largest state a Mamba block may have.
pub const MAX_SSM_KERNEL: u64 = 1 << 10;

/// A mixture-of-experts feed-forward's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Experts {
    /// Experts in each block (`{arch}.expert_count`, HF `num_local_experts`).
    pub count: u64,
    /// Experts each token is routed to (`{arch}.expert_used_count`, HF `num_experts_per_tok`).
    pub used: u64,
}

/// Most experts a mixture-of-experts block may have.
pub const MAX_EXPERTS: u64 = 1 << 10;

/// Which layers of a model with a sliding window use it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SwaPattern {
    /// Of every `n` layers the first `n − 1` use the window and the last attends to the whole
    /// context (llama.cpp's `sliding_window_pattern` integer; 1: no layer uses it).
    Period(u64),
    /// Per layer: true where the layer uses the window.
    Layers(Vec<bool>),
}

/// Attention settings past plain causal attention, as the file states them; an architecture
/// supplies its own defaults for what is missing.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AttentionExtras {
    /// Tokens a sliding-window layer sees: itself and the `window − 1` before it.
    pub sliding_window: Option<u64>,
    /// Which layers use the window.
    pub swa_pattern: Option<SwaPattern>,
    /// RoPE base frequency of the sliding-window layers (Gemma 3's local layers).
    pub rope_freq_base_swa: Option<f64>,
    /// Queries are scaled by `1/sqrt(query_pre_attn_scalar)` instead of `1/sqrt(head_dim)`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Attention scores become `cap·tanh(s/cap)` (Gemma 2).
    pub attn_logit_softcap: Option<f64>,
    /// Logits become `cap·tanh(l/cap)` (Gemma 2).
    pub final_logit_softcap: Option<f64>,
}

/// Why a config could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("missing {0}")]
    Missing(String),
    #[error("{field} is {value}: {why}")]
    Invalid {
        field: String,
        value: String,
        why: &'static str,
    },
    /// A value past what any real model needs and what buffers sized from it can hold.
    #[error("{field} is {value}: more than the limit of {max}")]
    TooLarge { field: String, value: u64, max: u64 },
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// Most transformer blocks a config may have.
pub const MAX_LAYERS: u64 = 4096;
/// Largest embedding length, FFN length and attention width (heads × head dimension).
pub const MAX_WIDTH: u64 = 1 << 20;
/// Largest head count and head dimension.
pub const MAX_HEAD: u64 = 1 << 14;
/// Longest context (and sliding window) a config may state.
pub const MAX_CONTEXT: u64 = 1 << 30;
/// Largest vocabulary (token ids are below 2^31).
pub const MAX_VOCAB: u64 = (1 << 31) - 1;

fn need(v: Option<u64>, what: &str) -> Result<u64, ConfigError> {
    v.ok_or_else(|| ConfigError::Missing(what.to_string()))
}

/// Shared checks and derived values for both sources.
fn assemble(mut c: ModelConfig, head_dim: Option<u64>) -> Result<ModelConfig, ConfigError> {
    let invalid = |field: &str, value: u64, why| ConfigError::Invalid {
        field: field.into(),
        value: value.to_string(),
        why,
    };
    for (field, v) in [("embedding length", c.n_embd), ("block count", c.n_layer)] {
        if v == 0 {
            return Err(invalid(field, v, "must be at least 1"));
        }
    }
    if c.ssm.is_some() {
        // A state-space model has no attention: no heads.
        c.n_head = 0;
        c.n_head_kv = 0;
        c.head_dim = 0;
        c.rope_dims = None;
        // Nor a feed-forward (llama.cpp's files state a length of 0).
        c.n_ff = None;
        check_limits(&c)?;
        return Ok(c);
    }
    if c.n_head == 0 {
        return Err(invalid("head count", 0, "must be at least 1"));
    }
    if c.n_head_kv == 0 || !c.n_head.is_multiple_of(c.n_head_kv) {
        return Err(ConfigError::Invalid {
            field: "KV head count".into(),
            value: format!("{} (of {} heads)", c.n_head_kv, c.n_head),
            why: "must divide the head count",
        });
    }
    c.head_dim = match head_dim {
        Some(0) => return Err(invalid("head dimension", 0, "must be at least 1")),
        Some(d) => d,
        None if c.n_embd.is_multiple_of(c.n_head) => c.n_embd / c.n_head,
        None => {
            return Err(invalid(
                "embedding length",
                c.n_embd,
                "is not a multiple of the head count",
            ))
        }
    };
    check_limits(&c)?;
    Ok(c)
}

/// Every size within the `MAX_*` limits (checked before anything is sized from them), and
/// the floats finite and positive where they must be.
fn check_limits(c: &ModelConfig) -> Result<(), ConfigError> {
    let at_most = |field: &str, value: u64, max: u64| {
        if value > max {
            Err(ConfigError::TooLarge {
                field: field.into(),
                value,
                max,
            })
        } else {
            Ok(())
        }
    };
    at_most("block count", c.n_layer, MAX_LAYERS)?;
    at_most("embedding length", c.n_embd, MAX_WIDTH)?;
    at_most("head count", c.n_head, MAX_HEAD)?;
    at_most("head dimension", c.head_dim, MAX_HEAD)?;
    // Both factors are at most 2^14, so the product cannot overflow.
    at_most(
        "attention width (heads × head dimension)",
        c.n_head * c.head_dim,
        MAX_WIDTH,
    )?;
    let at_least_1 = |field: &str, v: u64| {
        if v == 0 {
            Err(ConfigError::Invalid {
                field: field.into(),
                value: "0".into(),
                why: "must be at least 1",
            })
        } else {
            Ok(())
        }
    };
    if let Some(ff) = c.n_ff {
        at_least_1("feed-forward length", ff)?;
        at_most("feed-forward length", ff, MAX_WIDTH)?;
    }
    if let Some(v) = c.n_vocab {
        at_least_1("vocabulary size", v)?;
        at_most("vocabulary size", v, MAX_VOCAB)?;
    }
    if let Some(r) = c.rope_dims {
        if r == 0 || r % 2 == 1 {
            return Err(ConfigError::Invalid {
                field: "RoPE dimension count".into(),
                value: r.to_string(),
                why: "must be even and at least 2 (RoPE turns pairs)",
            });
        }
        at_most("RoPE dimension count", r, c.head_dim)?;
    }
    if let Some(n) = c.n_ctx_train {
        // Learned position tables (GPT-2) have a row per position.
        at_least_1("context length", n)?;
        at_most("context length", n, MAX_CONTEXT)?;
    }
    let positive = |field: &str, v: Option<f64>, zero_ok: bool| match v {
        Some(x) if !x.is_finite() || x < 0.0 || (x == 0.0 && !zero_ok) => {
            Err(ConfigError::Invalid {
                field: field.into(),
                value: x.to_string(),
                why: if zero_ok {
                    "must be finite and not negative"
                } else {
                    "must be finite and positive"
                },
            })
        }
        _ => Ok(()),
    };
    positive("norm epsilon", c.norm_eps, true)?;
    check_attention_extras(c)?;
    if let Some(x) = c.experts {
        if x.count < 2 {
            return Err(ConfigError::Invalid {
                field: "expert count".into(),
                value: x.count.to_string(),
                why: "must be at least 2 (a mixture of experts)",
            });
        }
        at_most("expert count", x.count, MAX_EXPERTS)?;
        if x.used == 0 || x.used > x.count {
            return Err(ConfigError::Invalid {
                field: "experts used per token".into(),
                value: format!("{} (of {} experts)", x.used, x.count),
                why: "must be at least 1 and at most the expert count",
            });
        }
    }
    if let Some(x) = c.ssm {
        check_ssm(&x)?;
    }
    positive("RoPE frequency base", c.rope_freq_base, false)?;
    let factor = match c.rope_scaling {
        RopeScaling::Linear { factor }
        | RopeScaling::Yarn { factor, .. }
        | RopeScaling::Llama3 { factor, .. } => Some(factor),
        _ => None,
    };
    positive("RoPE scaling factor", factor, false)
}

/// A Mamba block's sizes: the convolution at least 2 wide (its state holds the `width − 1`
/// inputs before a token), every size at least 1 and within the limits.
fn check_ssm(x: &Ssm) -> Result<(), ConfigError> {
    if x.conv_kernel < 2 {
        return Err(ConfigError::Invalid {
            field: "SSM convolution width".into(),
            value: x.conv_kernel.to_string(),
            why: "must be at least 2",
        });
    }
    for (field, v, max) in [
        ("SSM convolution width", x.conv_kernel, MAX_SSM_KERNEL),
        ("SSM inner size", x.inner_size, MAX_WIDTH),
        ("SSM state size", x.state_size, MAX_HEAD),
        ("SSM time-step rank", x.time_step_rank, MAX_WIDTH),
    ] {
        if v == 0 {
            return Err(ConfigError::Invalid {
                field: field.into(),
                value: "0".into(),
                why: "must be at least 1",
            });
        }
        if v > max {
            return Err(ConfigError::TooLarge {
                field: field.into(),
                value: v,
                max,
            });
        }
    }
    Ok(())
}

/// The window at least 1 and at most [`MAX_CONTEXT`], a period at least 1, a layer list
/// of one flag per layer, and the floats finite and positive.
fn check_attention_extras(c: &ModelConfig) -> Result<(), ConfigError> {
    let a = &c.attn;
    let invalid = |field: &str, value: String, why| ConfigError::Invalid {
        field: field.into(),
        value,
        why,
    };
    if let Some(w) = a.sliding_window {
        if w == 0 {
            return Err(invalid("sliding window", "0".into(), "must be at least 1"));
        }
        if w > MAX_CONTEXT {
            return Err(ConfigError::TooLarge {
                field: "sliding window".into(),
                value: w,
                max: MAX_CONTEXT,
            });
        }
    }
    match &a.swa_pattern {
        Some(SwaPattern::Period(0)) => {
            return Err(invalid(
                "sliding window pattern",
                "0".into(),
                "must be at least 1",
            ))
        }
        Some(SwaPattern::Layers(l)) if l.len() as u64 != c.n_layer => {
            return Err(invalid(
                "sliding window pattern",
                format!("{} flags", l.len()),
                "must give one flag per block",
            ))
        }
        _ => {}
    }
    for (field, v) in [
        ("sliding-window RoPE frequency base", a.rope_freq_base_swa),
        ("query_pre_attn_scalar", a.query_pre_attn_scalar),
        ("attention logit softcap", a.attn_logit_softcap),
        ("final logit softcap", a.final_logit_softcap),
    ] {
        if let Some(x) = v {
            if !x.is_finite() || x <= 0.0 {
                return Err(invalid(field, x.to_string(), "must be finite and positive"));
            }
        }
    }
    Ok(())
}

/// The experts of a file stating `count` (0 or 1: a dense model) and `used` (named
/// `used_key`, which a mixture of experts must give).
fn experts(
    count: Option<u64>,
    used: Option<u64>,
    used_key: &str,
) -> Result<Option<Experts>, ConfigError> {
    match count {
        None | Some(0) | Some(1) => Ok(None),
        Some(count) => Ok(Some(Experts {
            count,
            used: need(used, used_key)?,
        })),
    }
}

/// A Mamba config's block sizes (`None` for other model types): `intermediate_size` or
/// `expand · hidden_size` channels, and `time_step_rank` `"auto"` as `ceil(hidden_size / 16)`.
fn hf_ssm(c: &HfConfig, model_type: &str, n_embd: u64) -> Result<Option<Ssm>, ConfigError> {
    use crate::hf_config::TimeStepRank;
    if model_type != "mamba" {
        return Ok(None);
    }
    let inner_size = match (c.intermediate_size, c.expand) {
        (Some(n), _) => n,
        (None, Some(e)) => e.checked_mul(n_embd).ok_or_else(|| ConfigError::TooLarge {
            field: "SSM inner size".into(),
            value: u64::MAX,
            max: MAX_WIDTH,
        })?,
        (None, None) => n_embd.saturating_mul(2),
    };
    let time_step_rank = match &c.time_step_rank {
        Some(TimeStepRank::Rank(r)) => *r,
        Some(TimeStepRank::Auto(s)) if s == "auto" => n_embd.div_ceil(16),
        Some(TimeStepRank::Auto(s)) => {
            return Err(ConfigError::Invalid {
                field: "time_step_rank".into(),
                value: format!("{s:?}"),
                why: "is not a number or \"auto\"",
            })
        }
        None => n_embd.div_ceil(16),
    };
    Ok(Some(Ssm {
        conv_kernel: c.conv_kernel.unwrap_or(4),
        inner_size,
        state_size: c.state_size.unwrap_or(16),
        time_step_rank,
    }))
}

/// `{arch}.attention.sliding_window_pattern`: a period (integer) or a flag per layer.
fn gguf_swa_pattern(g: &Gguf) -> Result<Option<SwaPattern>, ConfigError> {
    use crate::gguf::{Array, Value};
    Ok(match g.get(Key::SlidingWindowPattern) {
        None => None,
        Some(Value::Array(Array::Bool(flags))) => Some(SwaPattern::Layers(flags.clone())),
        Some(_) => g
            .get_u64(Key::SlidingWindowPattern)?
            .map(SwaPattern::Period),
    })
}

/// HF `layer_types` (`"sliding_attention"` / `"full_attention"` per layer) or
/// `sliding_window_pattern` (a period).
fn hf_swa_pattern(c: &HfConfig) -> Result<Option<SwaPattern>, ConfigError> {
    if let Some(types) = &c.layer_types {
        let mut flags = Vec::with_capacity(types.len().min(MAX_LAYERS as usize));
        for t in types {
            flags.push(match t.as_str() {
                "sliding_attention" => true,
                "full_attention" => false,
                other => {
                    return Err(ConfigError::Invalid {
                        field: "layer_types".into(),
                        value: format!("{other:?}"),
                        why: "is not \"sliding_attention\" or \"full_attention\"",
                    })
                }
            });
        }
        return Ok(Some(SwaPattern::Layers(flags)));
    }
    Ok(c.sliding_window_pattern.map(SwaPattern::Period))
}

impl ModelConfig {
    /// The config's limits checked (as the readers check them), for a config built by hand.
    pub fn checked(&self) -> Result<(), ConfigError> {
        check_limits(self)
    }

    /// From GGUF metadata (`{arch}.*` keys).
    pub fn from_gguf(g: &Gguf) -> Result<ModelConfig, ConfigError> {
        let arch = g
            .get_str(Key::GeneralArchitecture)?
            .ok_or_else(|| ConfigError::Missing("general.architecture".into()))?;
        let key = |k: Key| k.resolve(arch).into_owned();
        let ssm = match g.get_u64(Key::SsmStateSize)? {
            None => None,
            Some(state_size) => Some(Ssm {
                conv_kernel: need(g.get_u64(Key::SsmConvKernel)?, &key(Key::SsmConvKernel))?,
                inner_size: need(g.get_u64(Key::SsmInnerSize)?, &key(Key::SsmInnerSize))?,
                state_size,
                time_step_rank: need(g.get_u64(Key::SsmTimeStepRank)?, &key(Key::SsmTimeStepRank))?,
            }),
        };
        let n_head = match g.get_u64(Key::HeadCount)? {
            None if ssm.is_some() => 0,
            v => need(v, &key(Key::HeadCount))?,
        };
        let n_vocab = match g.get_u64(Key::VocabSize)? {
            Some(v) => Some(v),
            None => g.get_array(Key::TokenizerTokens)?.map(|a| a.len() as u64),
        };
        let rope_scaling = match g.get_str(Key::RopeScalingType)? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear {
                factor: g.get_f64(Key::RopeScalingFactor)?.unwrap_or(1.0),
            },
            Some("yarn") => RopeScaling::Yarn {
                factor: g.get_f64(Key::RopeScalingFactor)?.unwrap_or(1.0),
                original_context: g.get_u64(Key::RopeScalingOriginalContextLength)?,
                attn_factor: g.get_f64(Key::RopeScalingAttnFactor)?,
                beta_fast: g.get_f64(Key::RopeScalingYarnBetaFast)?,
                beta_slow: g.get_f64(Key::RopeScalingYarnBetaSlow)?,
            },
            Some("longrope") => RopeScaling::LongRope {
                original_context: g.get_u64(Key::RopeScalingOriginalContextLength)?,
                short_factor: None,
                long_factor: None,
                attn_factor: g.get_f64(Key::RopeScalingAttnFactor)?,
            },
            Some(other) => RopeScaling::Other { name: other.into() },
        };
        // llama.cpp's Phi-3 files state no scaling type: the factor tensors say it.
        let rope_scaling = match rope_scaling {
            RopeScaling::None if g.tensor_info("rope_factors_long.weight").is_some() => {
                RopeScaling::LongRope {
                    original_context: g.get_u64(Key::RopeScalingOriginalContextLength)?,
                    short_factor: None,
                    long_factor: None,
                    attn_factor: g.get_f64(Key::RopeScalingAttnFactor)?,
                }
            }
            other => other,
        };
        let has_output = g.tensor_info("output.weight").is_some();
        let config = ModelConfig {
            architecture: Architecture::from_gguf_name(arch),
            n_vocab,
            n_ctx_train: g.get_u64(Key::ContextLength)?,
            n_embd: need(g.get_u64(Key::EmbeddingLength)?, &key(Key::EmbeddingLength))?,
            n_layer: need(g.get_u64(Key::BlockCount)?, &key(Key::BlockCount))?,
            n_head,
            n_head_kv: g.get_u64(Key::HeadCountKv)?.unwrap_or(n_head),
            head_dim: 0,
            n_ff: g.get_u64(Key::FeedForwardLength)?,
            norm_eps: match g.get_f64(Key::LayerNormRmsEpsilon)? {
                Some(e) => Some(e),
                None => g.get_f64(Key::LayerNormEpsilon)?,
            },
            rope_dims: g.get_u64(Key::RopeDimensionCount)?,
            rope_freq_base: g.get_f64(Key::RopeFreqBase)?,
            rope_scaling,
            tie_word_embeddings: Some(!has_output && g.tensor_info("token_embd.weight").is_some()),
            parallel_residual: g.get_bool(Key::UseParallelResidual)?,
            attn: AttentionExtras {
                sliding_window: g.get_u64(Key::SlidingWindow)?,
                swa_pattern: gguf_swa_pattern(g)?,
                rope_freq_base_swa: g.get_f64(Key::RopeFreqBaseSwa)?,
                query_pre_attn_scalar: None,
                attn_logit_softcap: g.get_f64(Key::AttnLogitSoftcapping)?,
                final_logit_softcap: g.get_f64(Key::FinalLogitSoftcapping)?,
            },
            experts: experts(
                g.get_u64(Key::ExpertCount)?,
                g.get_u64(Key::ExpertUsedCount)?,
                &key(Key::ExpertUsedCount),
            )?,
            ssm,
        };
        let config = assemble(config, g.get_u64(Key::KeyLength)?)?;
        // A file with blocks must hold its last one (a vocabulary-only file holds none).
        let last = format!("blk.{}.", config.n_layer - 1);
        let has = |prefix: &str| g.tensors().iter().any(|t| t.name.starts_with(prefix));
        if has("blk.") && !has(&last) {
            return Err(ConfigError::Invalid {
                field: key(Key::BlockCount),
                value: config.n_layer.to_string(),
                why: "the file has no tensors of its last block",
            });
        }
        Ok(config)
    }

    /// From a parsed `config.json`.
    pub fn from_hf(c: &HfConfig) -> Result<ModelConfig, ConfigError> {
        let model_type = c
            .model_type
            .as_deref()
            .ok_or_else(|| ConfigError::Missing("model_type".into()))?;
        let n_embd = need(c.hidden_size.or(c.n_embd), "hidden_size")?;
        let ssm = hf_ssm(c, model_type, n_embd)?;
        let n_head = match c.num_attention_heads.or(c.n_head) {
            None if ssm.is_some() => 0,
            v => need(v, "num_attention_heads")?,
        };
        let rope_scaling = match c.rope_scaling() {
            None => RopeScaling::None,
            Some(s) => {
                let factor = s.factor.unwrap_or(1.0);
                match s.kind() {
                    None | Some("default") => RopeScaling::None,
                    Some("linear") => RopeScaling::Linear { factor },
                    Some("yarn") => RopeScaling::Yarn {
                        factor,
                        original_context: s.original_max_position_embeddings,
                        attn_factor: s.attention_factor,
                        beta_fast: s.beta_fast,
                        beta_slow: s.beta_slow,
                    },
                    Some("llama3") => RopeScaling::Llama3 {
                        factor,
                        low_freq_factor: s.low_freq_factor,
                        high_freq_factor: s.high_freq_factor,
                        original_context: s.original_max_position_embeddings,
                    },
                    Some("longrope") | Some("su") => RopeScaling::LongRope {
                        original_context: s
                            .original_max_position_embeddings
                            .or(c.original_max_position_embeddings),
                        short_factor: s.short_factor.clone(),
                        long_factor: s.long_factor.clone(),
                        attn_factor: s.attention_factor,
                    },
                    Some(other) => RopeScaling::Other { name: other.into() },
                }
            }
        };
        let gpt2 = model_type == "gpt2";
        let config = ModelConfig {
            architecture: Architecture::from_hf_model_type(model_type),
            n_vocab: c.vocab_size,
            n_ctx_train: c.max_position_embeddings.or(c.n_positions).or(c.n_ctx),
            n_embd,
            n_layer: need(c.num_hidden_layers.or(c.n_layer), "num_hidden_layers")?,
            n_head,
            n_head_kv: c.num_key_value_heads.unwrap_or(n_head),
            head_dim: 0,
            n_ff: match ssm {
                // Mamba's intermediate size is its mixer's width; it has no feed-forward.
                Some(_) => None,
                None => c
                    .intermediate_size
                    .or(c.n_inner)
                    .or(gpt2.then_some(n_embd.saturating_mul(4))),
            },
            norm_eps: c.rms_norm_eps.or(c.layer_norm_epsilon).or(c.layer_norm_eps),
            rope_dims: None,
            rope_freq_base: if gpt2 || ssm.is_some() {
                None
            } else {
                Some(c.rope_theta().unwrap_or(10_000.0))
            },
            rope_scaling,
            tie_word_embeddings: Some(c.tie_word_embeddings.unwrap_or(gpt2)),
            parallel_residual: c.use_parallel_residual,
            attn: AttentionExtras {
                sliding_window: c.sliding_window,
                swa_pattern: hf_swa_pattern(c)?,
                rope_freq_base_swa: c.rope_local_base_freq.or_else(|| c.rope_theta_swa()),
                query_pre_attn_scalar: c.query_pre_attn_scalar,
                attn_logit_softcap: c.attn_logit_softcapping,
                final_logit_softcap: c.final_logit_softcapping,
            },
            experts: experts(
                c.num_local_experts,
                c.num_experts_per_tok,
                "num_experts_per_tok",
            )?,
            ssm,
        };
        let mut config = assemble(config, c.head_dim)?;
        if !gpt2 && config.ssm.is_none() {
            let fraction = c.partial_rotary().unwrap_or(1.0);
            if !(fraction > 0.0 && fraction <= 1.0) {
                return Err(ConfigError::Invalid {
                    field: "partial_rotary_factor".into(),
                    value: fraction.to_string(),
                    why: "must be in (0, 1]",
                });
            }
            config.rope_dims = Some((config.head_dim as f64 * fraction).round() as u64);
        }
        Ok(config)
    }
}
