//! `tnn inspect`: what a model file or directory holds, for people (table) or machines (`--json`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

pub use tinynn_models::inspect::Report;

#[derive(Args)]
pub struct InspectArgs {
    /// A .gguf file, a .safetensors file, a Hugging Face model directory or a model name:
    /// smollm2, gemma3 (default: smollm2, fetched into the cache if missing).
    pub path: Option<PathBuf>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Leave out the per-tensor table.
    #[arg(long)]
    pub no_tensors: bool,
}

pub fn run(args: &InspectArgs) -> Result<()> {
    let path = crate::models::resolve(args.path.as_deref())?;
    let mut report = Report::build(&path)?;
    if args.no_tensors {
        report.tensors.clear();
    }
    let out = if args.json {
        serde_json::to_string_pretty(&report)? + "\n"
    } else {
        tinynn_models::inspect_text::render(&report)
    };
    crate::generate::emit(&out)
}
