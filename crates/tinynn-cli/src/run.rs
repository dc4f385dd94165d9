//! `tnn run`: generate text from a prompt, streamed to stdout, with prompt and generation speed
//! on stderr. Flags follow llama.cpp's where they exist.

use std::path::PathBuf;
use std::time::Instant;

use crate::model::Model;
use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_models::chat::Message;
use tinynn_models::session::Session;

use crate::generate::{emit, generate, ModelArgs, SamplingArgs};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub lora: crate::lora_args::LoraArgs,
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
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System prompt for --chat (default: the template's own).
    #[arg(long = "system-prompt", visible_alias = "sys")]
    pub system: Option<String>,
    /// Chat template file to use instead of the model's.
    #[arg(long = "chat-template")]
    pub chat_template: Option<PathBuf>,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write the last decode step's per-op, per-thread timings to FILE (Chrome trace JSON,
    /// for chrome://tracing or Perfetto).
    #[arg(long = "trace", value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

pub fn run(args: &RunArgs) -> Result<()> {
    let path = args.model.path()?;
    let model = Model::open(&path)?;
    let tokenizer = model.tokenizer()?;
    let vocab = model.vocab(&tokenizer)?;
    let mut opts = args.model.exec_options();
    opts.trace = args.trace.is_some();
    let lora_file = args.lora.open()?;
    let adapter = crate::lora_args::adapter(lora_file.as_ref())?;
    let lora = crate::lora_args::applied(&args.lora, &adapter);
    let mut session = Session::with_lora(model.source(), args.model.ctx, opts, false, lora)
        .with_context(|| format!("loading {}", path.display()))?;
    session.set_n_batch(args.model.batch);
    let text = if args.chat {
        let template =
            crate::chat::template(&model, &tokenizer, &vocab, args.chat_template.as_deref())?;
        let mut messages = Vec::new();
        if let Some(sys) = &args.system {
            messages.push(Message::new("system", sys));
        }
        messages.push(Message::new("user", &args.prompt));
        template.render(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let prompt = tokenizer.encode(&text, true)?;
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
    let mut sampler = args.sampling.sampler();
    prompt.iter().for_each(|&t| sampler.accept(t));
    if !args.chat {
        emit(&args.prompt)?;
    }
    let t0 = Instant::now();
    session.eval_batch(&prompt)?;
    let prompt_time = t0.elapsed();
    let t1 = Instant::now();
    let generated = generate(
        &mut session,
        &mut sampler,
        &tokenizer,
        &vocab,
        args.n_predict,
        args.ignore_eos,
        &args.sampling.stop,
    )?;
    emit("\n")?;
    let gen_time = t1.elapsed();
    if let (Some(path), Some(trace)) = (&args.trace, session.chrome_trace()) {
        std::fs::write(path, trace).with_context(|| format!("writing {}", path.display()))?;
    }
    let rate = |n: usize, d: std::time::Duration| n as f64 / d.as_secs_f64().max(1e-9);
    eprintln!(
        "prompt: {} tokens in {:.0} ms ({:.1} t/s); generation: {} tokens in {:.0} ms ({:.1} t/s); {} threads",
        prompt.len(),
        prompt_time.as_secs_f64() * 1e3,
        rate(prompt.len(), prompt_time),
        generated.len(),
        gen_time.as_secs_f64() * 1e3,
        rate(generated.len(), gen_time),
        if opts.strict { 1 } else { opts.threads }
    );
    Ok(())
}
