//! `tnn finetune`: fine-tune a model (GGUF file or HF directory), fully (f32 master weights) or
//! with a LoRA adapter on the frozen base (which keeps its file type: QLoRA on quantized files).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use tinynn_train::data::Tokenization;
use tinynn_train::{LoraConfig, Targets, Trainer};

use crate::train_loop::{self, LoopArgs, Output};
use tinynn_models::model::Model;
use tinynn_train::collective::Collective;

#[derive(Args)]
pub struct FinetuneArgs {
    /// Model to fine-tune: a file, a directory or a model name (default: smollm2).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Train a LoRA adapter instead of every weight.
    #[arg(long)]
    pub lora: bool,
    /// LoRA rank.
    #[arg(long, default_value_t = 8, requires = "lora")]
    pub rank: usize,
    /// LoRA alpha (the adapter is scaled by alpha/rank).
    #[arg(long, default_value_t = 16.0, requires = "lora")]
    pub alpha: f32,
    /// LoRA dropout on the adapter's input.
    #[arg(long, default_value_t = 0.05, requires = "lora")]
    pub dropout: f32,
    /// Projections to adapt: some of q,k,v,o,gate,up,down,qkv (Mamba: in,x,dt,out), or all;
    /// q, k or v adapt a fused q/k/v projection (GPT-2) where the model has one. Default q,v
    /// (Mamba: in,out).
    #[arg(long, requires = "lora")]
    pub targets: Option<String>,
    /// Also write the base with the adapter merged in (DIR/merged.gguf; GGUF bases only).
    #[arg(long, requires = "lora")]
    pub merge: bool,
    /// The chat template for .jsonl data (default: the model's).
    #[command(flatten)]
    pub template: crate::chat_template_args::ChatTemplateArgs,
    #[command(flatten)]
    pub train: LoopArgs,
}

pub fn run(args: &FinetuneArgs, comm: &mut dyn Collective) -> Result<()> {
    let path = crate::models::resolve(args.model.as_deref())?;
    let model = Model::open(&path)?;
    let tokenizer = model.tokenizer()?;
    let la = &args.train;
    let template = if tinynn_train::data::is_chat(&la.data) {
        Some(crate::chat::template(&model, &args.template)?)
    } else {
        None
    };
    let lora = if args.lora {
        Some(LoraConfig {
            rank: args.rank,
            alpha: args.alpha,
            dropout: args.dropout,
            targets: Targets::parse(args.targets.as_deref().unwrap_or(match model.config().ssm {
                Some(_) => "in,out",
                None => "q,v",
            }))?,
            seed: la.seed,
        })
    } else {
        None
    };
    let cfg = la.train_config(lora);
    crate::ranks::warn_if_crowded(cfg.threads, comm);
    let mut trainer =
        Trainer::new(model.source(), cfg).with_context(|| format!("loading {}", path.display()))?;
    let mut batcher = la.batcher(
        &Tokenization {
            tokenizer,
            template: template.as_ref(),
            n_vocab: trainer.hparams().n_vocab,
        },
        comm.size(),
    )?;
    let run = la.identity(
        comm.size(),
        json!({
            "kind": "finetune",
            "model": path.display().to_string(),
            "lora": lora.map(|l| json!({
                "rank": l.rank,
                "alpha": l.alpha,
                "dropout": l.dropout,
                "targets": l.targets.to_list(),
            })),
        }),
    );
    let output = if args.lora {
        Output::Adapter { merge: args.merge }
    } else {
        Output::Model
    };
    train_loop::train(&mut trainer, &mut batcher, la, output, run, comm)
}
