//! `tnn chat`: an interactive multi-turn conversation on stdin/stdout. Each turn renders the
//! whole conversation with the chat template and evaluates only what the cache does not hold.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use crate::model::Model;
use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_models::chat::{ChatTemplate, Message};
use tinynn_models::session::Session;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::Vocab;

use crate::generate::{emit, generate, ModelArgs, SamplingArgs};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub lora: crate::lora_args::LoraArgs,
    /// System prompt (default: the template's own).
    #[arg(long = "system-prompt", visible_alias = "sys")]
    pub system: Option<String>,
    /// Chat template file to use instead of the model's.
    #[arg(long = "chat-template")]
    pub chat_template: Option<PathBuf>,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
}

/// The chat template: from `--chat-template`, else the model's.
pub fn template(
    model: &Model,
    tokenizer: &Tokenizer,
    vocab: &Vocab,
    path: Option<&Path>,
) -> Result<ChatTemplate> {
    let text = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(&vocab.token_bytes(i)).into_owned())
            .unwrap_or_default()
    };
    let (bos, eos) = (text(tokenizer.bos()), text(tokenizer.eos()));
    if let Some(p) = path {
        let source =
            std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
        return Ok(ChatTemplate::new(source, &bos, &eos));
    }
    match model.chat_template()? {
        Some(source) => Ok(ChatTemplate::new(source, &bos, &eos)),
        None => bail!("the model has no chat template; give one with --chat-template FILE"),
    }
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let path = args.model.path()?;
    let model = Model::open(&path)?;
    let tokenizer = model.tokenizer()?;
    let vocab = model.vocab(&tokenizer)?;
    let template = template(&model, &tokenizer, &vocab, args.chat_template.as_deref())?;
    let lora_file = args.lora.open()?;
    let adapter = crate::lora_args::adapter(lora_file.as_ref())?;
    let lora = crate::lora_args::applied(&args.lora, &adapter);
    let mut session = Session::with_lora(
        model.source(),
        args.model.ctx,
        args.model.exec_options(),
        false,
        lora,
    )?;
    session.set_n_batch(args.model.batch);
    let mut sampler = args.sampling.sampler();
    let mut messages = Vec::new();
    if let Some(sys) = &args.system {
        messages.push(Message::new("system", sys));
    }
    // Tokens whose K/V rows the cache holds, in order.
    let mut cached: Vec<u32> = Vec::new();
    eprintln!("tnn chat: type a message and press Enter; an empty line or end of input quits.");
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        messages.push(Message::new("user", line.trim_end()));
        let prompt = tokenizer.encode(&template.render(&messages, true)?, true)?;
        if prompt.len() >= session.n_ctx() {
            bail!(
                "the conversation is {} tokens, which does not fit the context of {} (raise -c)",
                prompt.len(),
                session.n_ctx()
            );
        }
        let common = cached
            .iter()
            .zip(&prompt)
            .take_while(|(a, b)| a == b)
            .count()
            .min(prompt.len() - 1);
        session.truncate(common);
        cached.truncate(common);
        prompt.iter().for_each(|&t| sampler.accept(t));
        session.eval_batch(&prompt[common..])?;
        cached.extend_from_slice(&prompt[common..]);
        let reply = generate(
            &mut session,
            &mut sampler,
            &tokenizer,
            &vocab,
            args.n_predict,
            false,
            &args.sampling.stop,
        )?;
        emit("\n")?;
        // The reply's last token was sampled but not evaluated: the cache holds the rest.
        cached.extend_from_slice(&reply[..reply.len().saturating_sub(1)]);
        messages.push(Message::new("assistant", &tokenizer.decode(&reply)?));
    }
    Ok(())
}
