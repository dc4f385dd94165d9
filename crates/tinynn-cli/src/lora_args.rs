//! `--lora ADAPTER.gguf [--lora-scale S]` for `tnn run` and `tnn chat`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tinynn_format::gguf::GgufFile;
use tinynn_models::lora::{AppliedLora, LoraAdapter};

#[derive(Args, Clone)]
pub struct LoraArgs {
    /// LoRA adapter to apply (llama.cpp's GGUF adapter format, e.g. from `tnn finetune --lora`).
    #[arg(long = "lora", value_name = "ADAPTER.gguf")]
    pub lora: Option<PathBuf>,
    /// Scale of the adapter's contribution (0 gives the base model).
    #[arg(long = "lora-scale", default_value_t = 1.0, requires = "lora")]
    pub scale: f32,
}

impl LoraArgs {
    /// The adapter's file, opened.
    pub fn open(&self) -> Result<Option<GgufFile>> {
        self.lora
            .as_ref()
            .map(|p| GgufFile::open(p).with_context(|| format!("opening {}", p.display())))
            .transpose()
    }
}

/// The adapter in `file`, checked as a LoRA adapter.
pub fn adapter(file: Option<&GgufFile>) -> Result<Option<LoraAdapter<'_>>> {
    Ok(file.map(LoraAdapter::from_gguf).transpose()?)
}

/// `adapter` at the scale the flags give.
pub fn applied<'a>(
    args: &LoraArgs,
    adapter: &'a Option<LoraAdapter<'a>>,
) -> Option<AppliedLora<'a>> {
    adapter.as_ref().map(|adapter| AppliedLora {
        adapter,
        scale: args.scale,
    })
}
