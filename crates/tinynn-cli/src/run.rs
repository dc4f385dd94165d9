//! `tnn run`: generate text from a prompt, streamed to stdout, with prompt and generation speed
//! on stderr. Flags follow llama.cpp's where they exist.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use tinynn_models::chat::Message;

use crate::generate::{emit, stream, ModelArgs, SamplingArgs};

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
    /// Tokens to generate (stops earlier at end of text); -1: until end of text or a full
    /// context.
    #[arg(short = 'n', long = "n-predict", default_value = "128",
          value_parser = crate::generate::parse_n_predict, allow_negative_numbers = true)]
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
    let model = args.model.open()?;
    let opts = args.model.exec_options();
    let mut session =
        args.model
            .session(model.clone(), args.lora.applied()?, args.trace.is_some())?;
    let text = if args.chat {
        let template = crate::chat::template(&model, args.chat_template.as_deref())?;
        let mut messages = Vec::new();
        if let Some(sys) = &args.system {
            messages.push(Message::new("system", sys));
        }
        messages.push(Message::new("user", &args.prompt));
        template.render(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let prompt = model.tokenizer()?.encode(&text, true)?;
    if !args.chat {
        emit(&args.prompt)?;
    }
    let gen_opts = args.sampling.options(args.n_predict, args.ignore_eos);
    let t0 = Instant::now();
    let generation = session.generate(&prompt, &gen_opts)?;
    let prompt_time = t0.elapsed();
    let t1 = Instant::now();
    let generated = stream(generation)?;
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
        generated,
        gen_time.as_secs_f64() * 1e3,
        rate(generated, gen_time),
        if opts.strict { 1 } else { opts.threads }
    );
    Ok(())
}
