//! `tnn run`: generate text from a prompt, streamed to stdout, with prompt and generation speed
//! on stderr. Flags follow llama.cpp's where they exist.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_cpu::ExecOptions;
use tinynn_format::gguf::GgufFile;
use tinynn_models::sampling::{Penalties, Sampler, Strategy};
use tinynn_models::session::Session;
use tinynn_models::tokenizer::{StreamDecoder, Tokenizer};
use tinynn_models::vocab::Vocab;

#[derive(Args)]
pub struct RunArgs {
    /// Model file (default: SmolLM2-135M-Instruct Q4_1 from the cache, fetched if missing).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// The prompt.
    #[arg(
        short = 'p',
        long = "prompt",
        default_value = "The capital of France is"
    )]
    pub prompt: String,
    /// Tokens to generate (stops earlier at end of text).
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Context length (prompt + generated tokens).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Threads (default: all cores).
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// Prompt batch size.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock); the same seed and settings give the same text.
    #[arg(short = 's', long = "seed")]
    pub seed: Option<u64>,
    /// Reference mode: one thread, f64 accumulation, unquantized activations.
    #[arg(long)]
    pub strict: bool,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
}

pub fn run(args: &RunArgs) -> Result<()> {
    let path = match &args.model {
        Some(p) => p.clone(),
        None => tinynn_format::model_cache::ensure_default_model()?,
    };
    let file = GgufFile::open(&path)?;
    let tokenizer = Tokenizer::from_gguf(file.gguf())
        .with_context(|| format!("{}: tokenizer", path.display()))?;
    let vocab = Vocab::from_gguf(file.gguf())?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let opts = ExecOptions {
        threads,
        strict: args.strict,
        trace: false,
    };
    let mut session = Session::new(&file, args.ctx, opts)
        .with_context(|| format!("loading {}", path.display()))?;
    session.set_n_batch(args.batch);
    let prompt = tokenizer.encode(&args.prompt, true)?;
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    if prompt.len() >= session.n_ctx() {
        bail!(
            "the prompt is {} tokens, which does not fit the context of {} (raise -c)",
            prompt.len(),
            session.n_ctx()
        );
    }
    let strategy = if args.temp <= 0.0 {
        Strategy::Greedy
    } else {
        let seed = args.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Strategy::Sample {
            temperature: args.temp,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            seed,
        }
    };
    let penalties = Penalties {
        repeat: args.repeat_penalty,
        presence: args.presence_penalty,
        frequency: args.frequency_penalty,
        last_n: args.repeat_last_n,
    };
    let mut sampler = Sampler::new(strategy, penalties);
    prompt.iter().for_each(|&t| sampler.accept(t));

    let mut out = std::io::stdout().lock();
    let mut write = |s: &str| -> Result<()> {
        match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            other => Ok(other?),
        }
    };
    write(&args.prompt)?;
    let t0 = Instant::now();
    let mut logits = session.eval_batch(&prompt)?.to_vec();
    let prompt_time = t0.elapsed();
    let budget = args.n_predict.min(session.n_ctx() - prompt.len());
    let mut stream = StreamDecoder::default();
    let t1 = Instant::now();
    let mut generated = 0;
    for _ in 0..budget {
        let next = sampler.sample(&logits);
        if tokenizer.is_end(next) && !args.ignore_eos {
            break;
        }
        sampler.accept(next);
        generated += 1;
        write(&stream.push(&vocab.token_bytes(next)))?;
        if generated == budget {
            break;
        }
        logits.copy_from_slice(session.eval(next)?);
    }
    write(&stream.finish())?;
    write("\n")?;
    let gen_time = t1.elapsed();
    let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!(
        "prompt: {} tokens in {:.0} ms ({:.1} t/s); generation: {} tokens in {:.0} ms ({:.1} t/s); {} threads",
        prompt.len(),
        prompt_time.as_secs_f64() * 1e3,
        rate(prompt.len(), prompt_time),
        generated,
        gen_time.as_secs_f64() * 1e3,
        rate(generated, gen_time),
        session_threads(threads, args.strict)
    );
    Ok(())
}

fn session_threads(threads: usize, strict: bool) -> usize {
    if strict {
        1
    } else {
        threads.max(1)
    }
}
