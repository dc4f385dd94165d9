//! `tnn quantize IN OUT TYPE`: a GGUF file converted to another type, tensor by tensor, with
//! llama.cpp's per-tensor choices for the K mixes (see `tinynn_models::quantize`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tinynn_format::gguf::GgufFile;
use tinynn_models::quantize::{quantize_file, Options, Report, Target};

#[derive(Args, Clone)]
pub struct QuantizeArgs {
    /// The GGUF file to convert.
    #[arg(value_name = "IN")]
    pub input: PathBuf,
    /// Where to write the new GGUF file (written atomically).
    #[arg(value_name = "OUT")]
    pub output: PathBuf,
    /// F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K (= Q4_K_S), Q5_K (= Q5_K_S), Q6_K,
    /// Q4_K_M or Q5_K_M.
    #[arg(value_name = "TYPE")]
    pub target: String,
    /// Convert tensors that are already quantized (each quantization adds its own error).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
}

const MIB: f64 = 1024.0 * 1024.0;

pub fn run(args: &QuantizeArgs) -> Result<()> {
    // INPUT may be a model name (`smollm2`) as well as a path.
    let args = &QuantizeArgs {
        input: crate::models::resolve(Some(&args.input))?,
        ..args.clone()
    };
    let Some(target) = Target::parse(&args.target) else {
        bail!(
            "unknown type '{}'; valid types: {}",
            args.target,
            Target::names()
        );
    };
    if args.input.is_dir() {
        bail!(
            "{}: is a directory; tnn quantize reads GGUF files only (convert a Hugging Face \
             model to GGUF first)",
            args.input.display()
        );
    }
    let input = GgufFile::open(&args.input)?;
    let opts = Options {
        target,
        allow_requantize: args.allow_requantize,
        threads: args
            .threads
            .unwrap_or_else(crate::generate::all_cores)
            .max(1),
    };
    let total: u64 = input.tensors().map(|t| t.n_elements()).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {percent:>3}% {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let mut done = 0u64;
    let report = quantize_file(&input, &args.output, &opts, &mut |p| {
        bar.set_position(done);
        bar.set_message(format!(
            "{}/{} {} {} → {}",
            p.index + 1,
            p.total,
            p.tensor.name,
            p.tensor.from,
            p.tensor.choice.ty
        ));
        done += p.tensor.n_elements();
    });
    bar.finish_and_clear();
    let report = report.with_context(|| format!("quantizing {}", args.input.display()))?;
    eprint!(
        "{}",
        summary(args, target, &report, t0.elapsed().as_secs_f64())
    );
    Ok(())
}

fn summary(args: &QuantizeArgs, target: Target, r: &Report, secs: f64) -> String {
    let mut s = format!(
        "tnn quantize: {} ({:.2} MiB) → {} ({:.2} MiB) as {target} in {secs:.1} s\n",
        args.input.display(),
        r.input_bytes as f64 / MIB,
        args.output.display(),
        r.output_bytes as f64 / MIB,
    );
    let counts: Vec<String> = r.counts.iter().map(|(t, n)| format!("{t} {n}")).collect();
    s += &format!("tensors: {}\n", counts.join(", "));
    if !r.fallbacks.is_empty() {
        let n: usize = r.counts.values().sum();
        let mut groups: BTreeMap<String, usize> = BTreeMap::new();
        for (_, f, got) in &r.fallbacks {
            let key = format!("{} → {got} (row length {})", f.wanted, f.row_len);
            *groups.entry(key).or_default() += 1;
        }
        s += &format!(
            "fallbacks: {} of {n} tensors could not use the type chosen for them (row length not \
             a whole number of its blocks):\n",
            r.fallbacks.len()
        );
        for (k, c) in groups {
            s += &format!("  {c:4} × {k}\n");
        }
    }
    s
}
