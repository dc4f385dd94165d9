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
use serde_json::json;
use tinynn_format::gguf::GgufFile;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::Vocab;
use tinynn_train::data::Tokenization;
use tinynn_train::scratch::{export_metadata, ScratchConfig};
use tinynn_train::{TrainSource, Trainer};

use crate::train_loop::{self, LoopArgs, Output};
use tinynn_train::collective::Collective;

#[derive(Args)]
pub struct TrainArgs {
    /// Model config (JSON; fields in `tnn train --help`'s module doc and the README).
    #[arg(long)]
    pub config: PathBuf,
    /// GGUF model (a path or a model name) whose tokenizer and chat template to use (default: smollm2).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// The chat template for .jsonl data (default: the model's).
    #[command(flatten)]
    pub template: crate::chat_template_args::ChatTemplateArgs,
    #[command(flatten)]
    pub train: LoopArgs,
}

pub fn run(args: &TrainArgs, comm: &mut dyn Collective) -> Result<()> {
    let la = &args.train;
    let text = std::fs::read_to_string(&args.config)
        .with_context(|| format!("reading {}", args.config.display()))?;
    let scratch: ScratchConfig = serde_json::from_str(&text)
        .with_context(|| format!("{}: not a model config", args.config.display()))?;
    let tok_path = crate::models::resolve(args.tokenizer.as_deref())?;
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
    let template = if tinynn_train::data::is_chat(&la.data) {
        let model = tinynn_models::model::Model::open(&tok_path)?;
        Some(crate::chat::template(&model, &args.template)?)
    } else {
        None
    };
    let cfg = la.train_config(None);
    crate::ranks::warn_if_crowded(cfg.threads, comm);
    let meta = export_metadata(&config, &tok_file);
    let mut trainer = Trainer::new(
        TrainSource::Random {
            config: Box::new(config),
            seed: la.seed,
        },
        cfg,
    )?;
    trainer.set_export_metadata(meta);
    let mut batcher = la.batcher(
        &Tokenization {
            tokenizer: &tokenizer,
            template: template.as_ref(),
            n_vocab: trainer.hparams().n_vocab,
        },
        comm.size(),
    )?;
    let run = la.identity(
        comm.size(),
        json!({
            "kind": "train",
            "config": serde_json::from_str::<serde_json::Value>(&text)?,
            "tokenizer": tok_path.display().to_string(),
        }),
    );
    train_loop::train(&mut trainer, &mut batcher, la, Output::Model, run, comm)
}
