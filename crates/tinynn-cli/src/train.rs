//! `tnn train`: train a model from scratch (seeded random init) from a JSON config, with the
//! tokenizer of a GGUF model (the default model's unless `--tokenizer`).
//!
//! The config's fields (JSON object): `architecture` (an architecture the registry
//! `tinynn_models::arch` lets train: "llama", "mistral", "qwen2", "qwen3"; default "llama"),
//! `n_embd`, `n_layer`, `n_head`, `n_ff` (required), `n_head_kv` (default `n_head`),
//! `head_dim` (default `n_embd / n_head`), `n_ctx` (default 2048), `n_vocab` (default: the
//! tokenizer's), `norm_eps` (1e-5), `rope_freq_base` (10000), `tie_word_embeddings` (true).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Deserialize;
use serde_json::json;
use tinynn_format::gguf::{GgufFile, GgufString, Value};
use tinynn_format::model_config::{Architecture, ModelConfig, RopeScaling};
use tinynn_models::arch;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::Vocab;
use tinynn_train::{TrainSource, Trainer};

use crate::train_data::Tokenization;
use crate::train_loop::{self, LoopArgs, Output};

#[derive(Args)]
pub struct TrainArgs {
    /// Model config (JSON; fields in `tnn train --help`'s module doc and the README).
    #[arg(long)]
    pub config: PathBuf,
    /// GGUF model whose tokenizer (and chat template) to use (default: the default model's).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Chat template file for .jsonl data (default: the tokenizer model's).
    #[arg(long = "chat-template")]
    pub chat_template: Option<PathBuf>,
    #[command(flatten)]
    pub train: LoopArgs,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct ScratchConfig {
    #[serde(default = "llama")]
    architecture: String,
    n_embd: u64,
    n_layer: u64,
    n_head: u64,
    n_ff: u64,
    n_head_kv: Option<u64>,
    head_dim: Option<u64>,
    #[serde(default = "n_ctx")]
    n_ctx: u64,
    n_vocab: Option<u64>,
    #[serde(default = "eps")]
    norm_eps: f64,
    #[serde(default = "base")]
    rope_freq_base: f64,
    #[serde(default = "yes")]
    tie_word_embeddings: bool,
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
    fn model_config(&self, n_vocab: u64) -> Result<ModelConfig> {
        if !arch::by_name(&self.architecture).is_some_and(|a| a.train) {
            bail!(
                "architecture '{}' cannot be trained ({})",
                self.architecture,
                arch::names(|a| a.train)
            );
        }
        let architecture = Architecture::from_gguf_name(&self.architecture);
        if self.n_head == 0 || self.n_embd == 0 || self.n_layer == 0 || self.n_ff == 0 {
            bail!("n_embd, n_layer, n_head and n_ff must be at least 1");
        }
        let n_head_kv = self.n_head_kv.unwrap_or(self.n_head);
        if n_head_kv == 0 || !self.n_head.is_multiple_of(n_head_kv) {
            bail!(
                "n_head {} is not a multiple of n_head_kv {n_head_kv}",
                self.n_head
            );
        }
        Ok(ModelConfig {
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
        })
    }
}

/// GGUF metadata for an export: the config's hyperparameters and the tokenizer file's
/// `tokenizer.*` keys.
fn metadata(c: &ModelConfig, tok: &GgufFile) -> Vec<(String, Value)> {
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

pub fn run(args: &TrainArgs) -> Result<()> {
    let la = &args.train;
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let scratch: ScratchConfig = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a model config", args.config.display()))?;
    let tok_path = match &args.tokenizer {
        Some(p) => p.clone(),
        None => tinynn_format::model_cache::ensure_default_model()?,
    };
    let tok_file = GgufFile::open(&tok_path).with_context(|| {
        format!(
            "{}: the tokenizer must come from a GGUF file",
            tok_path.display()
        )
    })?;
    let tokenizer = Tokenizer::from_gguf(tok_file.gguf())?;
    let vocab = Vocab::from_gguf(tok_file.gguf())?;
    let config = scratch.model_config(vocab.len() as u64)?;
    if config.n_vocab.unwrap_or(0) < vocab.len() as u64 {
        bail!(
            "n_vocab {:?} is smaller than the tokenizer's {} tokens",
            config.n_vocab,
            vocab.len()
        );
    }
    let template = if la.chat_data() {
        let model = tinynn_models::model::Model::open(&tok_path)?;
        Some(crate::chat::template(
            &model,
            args.chat_template.as_deref(),
        )?)
    } else {
        None
    };
    let cfg = la.train_config(None);
    let meta = metadata(&config, &tok_file);
    let mut trainer = Trainer::new(
        TrainSource::Random {
            config: Box::new(config),
            seed: la.seed,
        },
        cfg,
    )?;
    trainer.set_export_metadata(meta);
    let mut batcher = la.batcher(&Tokenization {
        tokenizer: &tokenizer,
        template: template.as_ref(),
        n_vocab: trainer.hparams().n_vocab,
    })?;
    let run = la.identity(json!({
        "kind": "train",
        "config": serde_json::from_str::<serde_json::Value>(&text)?,
        "tokenizer": tok_path.display().to_string(),
    }));
    train_loop::train(&mut trainer, &mut batcher, la, Output::Model, run)
}
