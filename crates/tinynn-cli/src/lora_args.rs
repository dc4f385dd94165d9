//! `--lora ADAPTER.gguf [--lora-scale S]` for `tnn run` and `tnn chat`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
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
    /// The adapter, opened and checked, at the scale the flags give.
    pub fn applied(&self) -> Result<Option<AppliedLora>> {
        self.lora
            .as_ref()
            .map(|p| {
                let adapter =
                    LoraAdapter::open(p).with_context(|| format!("opening {}", p.display()))?;
                Ok(AppliedLora::new(adapter, self.scale))
            })
            .transpose()
    }
}
