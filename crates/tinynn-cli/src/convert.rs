//! `tnn convert HF_DIR OUT.gguf [TYPE]`: a Hugging Face directory written as llama.cpp's
//! converter would write it (see `tinynn_models::convert`); a quantized TYPE converts to F32
//! first and quantizes that with `tnn quantize`'s rules.
//!
//! `tnn convert MODEL.gguf OUT_DIR [TYPE]`: the other way, a GGUF model written as a Hugging
//! Face directory (`tinynn_models::convert::to_hf`), TYPE F32, F16 or BF16 (default).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_format::GgmlType;
use tinynn_models::convert::to_hf::{export_hf, ExportOptions};
use tinynn_models::convert::{convert_hf, ConvertOptions};
use tinynn_models::model::Model;
use tinynn_models::quantize::Target;

#[derive(Args, Clone)]
pub struct ConvertArgs {
    /// The Hugging Face model directory (config.json, *.safetensors, tokenizer.json), or a
    /// GGUF file to write as a Hugging Face directory.
    #[arg(value_name = "HF_DIR|MODEL.gguf")]
    pub input: PathBuf,
    /// Where to write the GGUF file (written atomically), or the Hugging Face directory (new
    /// or empty) when the input is a GGUF file.
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// To GGUF: F16 (default), F32, BF16, or any `tnn quantize` type (Q8_0, Q4_K_M, ...).
    /// To a Hugging Face directory: BF16 (default), F16 or F32.
    #[arg(value_name = "TYPE")]
    pub target: Option<String>,
    /// Write the weights and shape only, without the vocabulary.
    #[arg(long)]
    pub no_tokenizer: bool,
    /// Threads for quantizing (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

pub fn run(args: &ConvertArgs) -> Result<()> {
    // INPUT may be a model name (`smollm2`) as well as a path.
    let args = &ConvertArgs {
        input: crate::models::resolve(Some(&args.input))?,
        ..args.clone()
    };
    if args.input.is_file() {
        return to_hf(args);
    }
    let target = args.target.as_deref().unwrap_or("F16");
    let direct = match target.to_ascii_uppercase().as_str() {
        "F32" => Some(GgmlType::F32),
        "F16" => Some(GgmlType::F16),
        "BF16" => Some(GgmlType::Bf16),
        _ => None,
    };
    if direct.is_none() && Target::parse(target).is_none() {
        bail!(
            "unknown type '{}'; valid types: {}",
            target,
            Target::names()
        );
    }
    if !args.input.is_dir() {
        bail!(
            "{}: no such directory or file (tnn convert reads a Hugging Face model directory or a GGUF file)",
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
    print_written(
        &format!("{}:", written.display()),
        report.tensors,
        report.bytes,
        report.tokens,
        t0,
    );
    if direct.is_some() {
        return Ok(());
    }
    let quantized = crate::quantize::run(&crate::quantize::QuantizeArgs {
        input: written.clone(),
        output: args.output.clone(),
        target: target.to_string(),
        allow_requantize: false,
        threads: args.threads,
    });
    let removed = std::fs::remove_file(&written);
    quantized?;
    removed.with_context(|| format!("removing {}", written.display()))
}

/// A GGUF file written as a Hugging Face directory.
fn to_hf(args: &ConvertArgs) -> Result<()> {
    if args
        .output
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        bail!(
            "{} is a GGUF file already: `tnn convert` writes it as a Hugging Face directory \
             (OUT a directory), and `tnn quantize` writes it as another GGUF type",
            args.input.display()
        );
    }
    let target = args.target.as_deref().unwrap_or("BF16");
    let dtype = match target.to_ascii_uppercase().as_str() {
        "F32" => GgmlType::F32,
        "F16" => GgmlType::F16,
        "BF16" => GgmlType::Bf16,
        _ => bail!(
            "unknown type '{target}' for a Hugging Face directory; valid types: BF16, F16, F32"
        ),
    };
    let t0 = Instant::now();
    let model =
        Model::open(&args.input).with_context(|| format!("opening {}", args.input.display()))?;
    let opts = ExportOptions {
        dtype,
        tokenizer: !args.no_tokenizer,
    };
    let report = export_hf(&model, &args.output, &opts)
        .with_context(|| format!("writing {}", args.output.display()))?;
    print_written(
        &format!("{}: {}", args.output.display(), report.architecture),
        report.tensors,
        report.bytes,
        report.tokens,
        t0,
    );
    Ok(())
}

/// `WHAT N tensors, X MiB, T tokens in S s` on stderr.
fn print_written(what: &str, tensors: usize, bytes: u64, tokens: usize, t0: Instant) {
    eprintln!(
        "{what} {tensors} tensors, {:.1} MiB{} in {:.1} s",
        bytes as f64 / (1024.0 * 1024.0),
        match tokens {
            0 => " (no tokenizer)".to_string(),
            n => format!(", {n} tokens"),
        },
        t0.elapsed().as_secs_f64()
    );
}
