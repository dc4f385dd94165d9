//! `--lora ADAPTER.gguf [--lora-scale S]` and `--lora-scaled ADAPTER.gguf S` (each repeatable,
//! as in llama.cpp) for `tnn run`, `tnn chat` and `tnn serve`.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_models::lora::{AppliedLora, LoraAdapter};

#[derive(Args, Clone)]
pub struct LoraArgs {
    /// LoRA adapter to apply (llama.cpp's GGUF adapter format, e.g. from `tnn finetune --lora`);
    /// repeat for several (their contributions add up).
    #[arg(long = "lora", value_name = "ADAPTER.gguf")]
    pub lora: Vec<PathBuf>,
    /// Scale of the `--lora` adapters' contributions (0 gives the base model).
    #[arg(
        long = "lora-scale",
        default_value_t = 1.0,
        allow_negative_numbers = true
    )]
    pub scale: f32,
    /// An adapter with its own scale: `--lora-scaled ADAPTER.gguf S` (repeatable).
    #[arg(long = "lora-scaled", num_args = 2, value_names = ["ADAPTER.gguf", "SCALE"], allow_negative_numbers = true)]
    pub scaled: Vec<String>,
}

impl LoraArgs {
    /// The adapters, opened and checked, at the scales the flags give (`--lora` ones first).
    pub fn applied(&self) -> Result<Vec<AppliedLora>> {
        let mut out = Vec::new();
        let open = |p: &PathBuf, scale: f32| -> Result<AppliedLora> {
            let adapter =
                LoraAdapter::open(p).with_context(|| format!("opening {}", p.display()))?;
            Ok(AppliedLora::new(adapter, scale))
        };
        for p in &self.lora {
            out.push(open(p, self.scale)?);
        }
        for pair in self.scaled.chunks(2) {
            let [path, scale] = pair else {
                bail!("--lora-scaled takes an adapter and a scale");
            };
            let s: f32 = scale
                .parse()
                .ok()
                .filter(|s: &f32| s.is_finite())
                .with_context(|| {
                    format!("--lora-scaled {path} {scale}: the scale is not a number")
                })?;
            out.push(open(&PathBuf::from(path), s)?);
        }
        Ok(out)
    }
}
