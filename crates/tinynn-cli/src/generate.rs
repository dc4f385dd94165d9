//! What `tnn run` and `tnn chat` share: sampling flags, model loading, and the generation loop.

use std::io::Write;
use std::path::PathBuf;

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tinynn_cpu::ExecOptions;
use tinynn_models::generate::{GenerateOptions, Generation};
use tinynn_models::lora::AppliedLora;
use tinynn_models::model::Model;
use tinynn_models::sampling::{Penalties, Strategy};
use tinynn_models::session::{Session, SessionOptions};

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model file, or a model name: smollm2, gemma3 (default: smollm2, fetched into the cache if missing).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context length (prompt + generated tokens).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Prompt batch size.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Reference mode: one thread, f64 accumulation, unquantized activations.
    #[arg(long)]
    pub strict: bool,
    /// Use the file's weight layout as is (no interleaved copy for the matrix kernels).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

impl ModelArgs {
    pub fn path(&self) -> Result<PathBuf> {
        crate::models::resolve(self.model.as_deref())
    }

    /// Opens the model `-m` names (or the default one).
    pub fn open(&self) -> Result<Arc<Model>> {
        let path = self.path()?;
        let t0 = std::time::Instant::now();
        let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
        eprintln!(
            "tinynn: loaded {} ({}) in {:.2} s",
            path.display(),
            crate::models::human_size(file_size(&path)),
            t0.elapsed().as_secs_f64()
        );
        Ok(model)
    }

    /// A one-sequence session over `model` with these flags, the adapters given, and
    /// `trace` (per-step timings of the last run).
    pub fn session(
        &self,
        model: Arc<Model>,
        lora: Vec<AppliedLora>,
        trace: bool,
    ) -> Result<Session> {
        let path = model.path().display().to_string();
        let mut exec = self.exec_options();
        exec.trace = trace;
        let opts = SessionOptions {
            n_ctx: self.ctx,
            n_batch: self.batch,
            exec,
            lora,
            ..SessionOptions::default()
        };
        let t0 = std::time::Instant::now();
        let before = model.packed_bytes();
        let session = Session::with_options(model.clone(), opts)
            .with_context(|| format!("loading {path}"))?;
        note_repacked(&model, before, t0);
        Ok(session)
    }

    pub fn exec_options(&self) -> ExecOptions {
        exec_options(self.threads, self.strict, self.no_repack)
    }
}

/// Bytes of a model file, or of all files in a model directory.
pub fn file_size(path: &std::path::Path) -> u64 {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|d| {
                d.filter_map(|e| e.ok()?.metadata().ok())
                    .filter(|m| m.is_file())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0),
        Ok(m) => m.len(),
        Err(_) => 0,
    }
}

/// Says on stderr how long the session took to build when it repacked weights (the model's
/// packed bytes grew from `before`); building a session is quick otherwise.
pub fn note_repacked(model: &Model, before: usize, t0: std::time::Instant) {
    let packed = model.packed_bytes().saturating_sub(before);
    if packed > 0 {
        eprintln!(
            "tinynn: weights repacked for the matrix kernels ({}) in {:.2} s",
            crate::models::human_size(packed as u64),
            t0.elapsed().as_secs_f64()
        );
    }
}

/// Inference settings from the usual flags: `-t` (default: every core), `--strict`,
/// `--no-repack`; threads give way when another process takes a core.
pub fn exec_options(threads: Option<usize>, strict: bool, no_repack: bool) -> ExecOptions {
    ExecOptions {
        threads: threads.unwrap_or_else(all_cores),
        strict,
        repack: !no_repack,
        adaptive_threads: true,
        ..ExecOptions::default()
    }
}

/// The cores this process may use.
pub fn all_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[derive(Args, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the k most likely tokens (0 keeps all).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 keeps all).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p times the most likely one (0 keeps all).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Divide the logits of recent tokens by this (1 is off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract this from the logit of any recent token (0 is off).
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// Subtract this per occurrence among recent tokens (0 is off).
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default, or -1: from the clock); the same seed and settings give the same
    /// text.
    #[arg(short = 's', long = "seed", value_parser = parse_seed, allow_negative_numbers = true)]
    pub seed: Option<u64>,
    /// Stop when the output contains this text (repeatable); it is not printed.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

/// `-n`: a count, or -1 for "until end of text or a full context" (llama.cpp's spelling).
pub fn parse_n_predict(s: &str) -> Result<usize, String> {
    match s.trim().parse::<i64>() {
        Ok(-1) => Ok(usize::MAX),
        Ok(n) if n >= 0 => Ok(n as usize),
        _ => Err(format!(
            "'{s}' is not a token count (a number ≥ 0, or -1 for no limit)"
        )),
    }
}

/// `-s`: a seed, or -1 for one from the clock (llama.cpp's spelling).
pub fn parse_seed(s: &str) -> Result<u64, String> {
    match s.trim().parse::<i128>() {
        Ok(-1) => Ok(u64::MAX),
        Ok(n) if (0..i128::from(u64::MAX)).contains(&n) => Ok(n as u64),
        _ => Err(format!(
            "'{s}' is not a seed (0 to 2^64 - 2, or -1 for a random one)"
        )),
    }
}

impl SamplingArgs {
    /// The library's generation options for these flags and `max_tokens`.
    pub fn options(&self, max_tokens: usize, ignore_eos: bool) -> GenerateOptions {
        let strategy = if self.temp <= 0.0 {
            Strategy::Greedy
        } else {
            // u64::MAX is what `-s -1` parses to: a seed from the clock.
            let seed = self.seed.filter(|&s| s != u64::MAX).unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_nanos() as u64)
            });
            Strategy::Sample {
                temperature: self.temp,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                seed,
            }
        };
        GenerateOptions {
            max_tokens,
            strategy,
            penalties: Penalties {
                repeat: self.repeat_penalty,
                presence: self.presence_penalty,
                frequency: self.frequency_penalty,
                last_n: self.repeat_last_n,
            },
            stop: self.stop.clone(),
            ignore_eos,
        }
    }
}

/// Writes to stdout and flushes; a closed pipe (e.g. `| head`) ends output quietly.
pub fn emit(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Streams a generation's pieces to stdout; returns how many tokens it produced.
pub fn stream(mut generation: Generation<'_>) -> Result<usize> {
    for piece in generation.by_ref() {
        emit(&piece?.text)?;
    }
    Ok(generation.tokens().len())
}
