//! `tnn convert HF_DIR OUT.gguf [TYPE]`: a Hugging Face directory written as llama.cpp's
//! converter would write it (see `tinynn_models::convert`); a quantized TYPE converts to F32
//! first and quantizes that with `tnn quantize`'s rules.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_format::GgmlType;
use tinynn_models::convert::{convert_hf, ConvertOptions};
use tinynn_models::model::Model;
use tinynn_models::quantize::Target;

#[derive(Args)]
pub struct ConvertArgs {
    /// The Hugging Face model directory (config.json, *.safetensors, tokenizer.json).
    #[arg(value_name = "HF_DIR")]
    pub input: PathBuf,
    /// Where to write the GGUF file (written atomically).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// F16 (default), F32, BF16, or any `tnn quantize` type (Q8_0, Q4_K_M, ...).
    #[arg(value_name = "TYPE", default_value = "F16")]
    pub target: String,
    /// Write the weights and shape only, without the vocabulary of tokenizer.json.
    #[arg(long)]
    pub no_tokenizer: bool,
    /// Threads for quantizing (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

pub fn run(args: &ConvertArgs) -> Result<()> {
    let direct = match args.target.to_ascii_uppercase().as_str() {
        "F32" => Some(GgmlType::F32),
        "F16" => Some(GgmlType::F16),
        "BF16" => Some(GgmlType::Bf16),
        _ => None,
    };
    if direct.is_none() && Target::parse(&args.target).is_none() {
        bail!(
            "unknown type '{}'; valid types: {}",
            args.target,
            Target::names()
        );
    }
    if !args.input.is_dir() {
        bail!(
            "{}: not a directory (tnn convert reads a Hugging Face model directory)",
            args.input.display()
        );
    }
    let t0 = Instant::now();
    let model =
        Model::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let written = match direct {
        Some(_) => args.output.clone(),
        None => {
            let mut name = args.output.clone().into_os_string();
            name.push(".f32.tmp");
            PathBuf::from(name)
        }
    };
    let opts = ConvertOptions {
        out_type: direct.unwrap_or(GgmlType::F32),
        tokenizer: !args.no_tokenizer,
    };
    let report = convert_hf(&model, &written, &opts)?;
    eprintln!(
        "{}: {} tensors, {:.1} MiB{} in {:.1} s",
        written.display(),
        report.tensors,
        report.bytes as f64 / (1024.0 * 1024.0),
        match report.tokens {
            0 => " (no tokenizer)".to_string(),
            n => format!(", {n} tokens"),
        },
        t0.elapsed().as_secs_f64()
    );
    if direct.is_some() {
        return Ok(());
    }
    let quantized = crate::quantize::run(&crate::quantize::QuantizeArgs {
        input: written.clone(),
        output: args.output.clone(),
        target: args.target.clone(),
        allow_requantize: false,
        threads: args.threads,
    });
    let removed = std::fs::remove_file(&written);
    quantized?;
    removed.with_context(|| format!("removing {}", written.display()))
}
