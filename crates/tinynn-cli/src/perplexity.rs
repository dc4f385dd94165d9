//! `tnn perplexity`: perplexity of a model on a text file, computed as llama.cpp's
//! `llama-perplexity` does (windows of `-c` tokens, second half of each scored).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tinynn_models::model::Model;
use tinynn_models::perplexity::perplexity;
use tinynn_models::session::{Session, SessionOptions};

#[derive(Args)]
pub struct PerplexityArgs {
    /// Model file, or a model name: smollm2, gemma3 (default: smollm2, fetched into the cache if missing).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// The text to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Window length in tokens.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Score at most this many windows.
    #[arg(long = "chunks")]
    pub chunks: Option<usize>,
    /// Reference mode: one thread, f64 accumulation, unquantized activations.
    #[arg(long)]
    pub strict: bool,
    /// Use the file's weight layout as is (no interleaved copy for the matrix kernels).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

pub fn run(args: &PerplexityArgs) -> Result<()> {
    let path = crate::models::resolve(args.model.as_deref())?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let t0 = Instant::now();
    let model = Model::open(&path)?;
    let tokenizer = model.tokenizer()?;
    eprintln!(
        "tinynn: loaded {} ({}) in {:.2} s; tokenizing {} ({})",
        path.display(),
        crate::models::human_size(crate::generate::file_size(&path)),
        t0.elapsed().as_secs_f64(),
        args.file.display(),
        crate::models::human_size(text.len() as u64)
    );
    let t0 = Instant::now();
    let tokens = tokenizer.encode(&text, true)?;
    eprintln!(
        "tinynn: {} tokens in {:.2} s",
        tokens.len(),
        t0.elapsed().as_secs_f64()
    );
    let so = SessionOptions {
        n_ctx: args.ctx,
        exec: crate::generate::exec_options(args.threads, args.strict, args.no_repack),
        all_logits: true,
        ..SessionOptions::default()
    };
    let t0 = Instant::now();
    let before = model.packed_bytes();
    let mut session = Session::with_options(model.clone(), so)
        .with_context(|| format!("loading {}", path.display()))?;
    crate::generate::note_repacked(&model, before, t0);
    let n_chunks = (tokens.len() / session.n_ctx()).min(args.chunks.unwrap_or(usize::MAX));
    eprintln!(
        "tnn perplexity: {} tokens, {n_chunks} windows of {}",
        tokens.len(),
        session.n_ctx()
    );
    let bar = ProgressBar::new(n_chunks as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} windows, {msg}, ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let t0 = Instant::now();
    let mut running = String::new();
    let result = perplexity(
        &mut session,
        &tokens,
        tokenizer.added_bos(),
        args.chunks,
        |r| {
            running.push_str(&format!("[{}]{:.4},", r.chunk, r.running_ppl));
            bar.set_message(format!("PPL {:.4}", r.running_ppl));
            bar.inc(1);
        },
    )?;
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    crate::generate::emit(&format!(
        "{running}\nFinal estimate: PPL = {:.4} +/- {:.5}\n",
        result.ppl, result.error
    ))?;
    eprintln!(
        "{} windows, {} tokens scored in {:.1} s ({:.0} tokens/s)",
        result.n_chunks,
        result.tokens_scored,
        secs,
        (result.n_chunks * session.n_ctx()) as f64 / secs.max(1e-9)
    );
    Ok(())
}
