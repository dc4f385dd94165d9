//! `tnn chat`: an interactive multi-turn conversation on stdin/stdout. Each turn renders the
//! whole conversation with the chat template and evaluates only what the cache does not hold.

use std::io::BufRead;

use anyhow::{bail, Result};
use clap::Args;
use tinynn_models::chat::{ChatTemplate, Message};
use tinynn_models::model::Model;

use crate::generate::{emit, ModelArgs, SamplingArgs};

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
    #[command(flatten)]
    pub template: crate::chat_template_args::ChatTemplateArgs,
    /// Most tokens per reply.
    #[arg(short = 'n', long = "n-predict", default_value = "512",
          value_parser = crate::generate::parse_n_predict, allow_negative_numbers = true)]
    pub n_predict: usize,
}

/// The chat template: from `--chat-template` / `--chat-template-file`, else the model's.
pub fn template(
    model: &Model,
    args: &crate::chat_template_args::ChatTemplateArgs,
) -> Result<ChatTemplate> {
    let source = args.source()?;
    if source.is_none() && model.chat_template_source().is_none() {
        bail!(
            "the model has no chat template; give one with --chat-template NAME|JINJA or --chat-template-file FILE"
        );
    }
    Ok(model.chat_template(source)?)
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let model = args.model.open()?;
    let template = template(&model, &args.template)?;
    let mut session = args
        .model
        .session(model.clone(), args.lora.applied()?, false)?;
    let tokenizer = model.tokenizer()?;
    // One sampler for the whole conversation: penalties and the random state carry over.
    let opts = args.sampling.options(args.n_predict, false);
    let mut sampler = opts.sampler();
    let mut messages = Vec::new();
    if let Some(sys) = &args.system {
        messages.push(Message::new("system", sys));
    }
    eprintln!("tnn chat: type a message and press Enter; an empty line or end of input quits.");
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            break;
        }
        messages.push(Message::new("user", line.trim_end()));
        let prompt = tokenizer.encode(&template.render(&messages, true)?, true)?;
        let mut generation = session.generate_with(&prompt, &opts, &mut sampler)?;
        for piece in generation.by_ref() {
            emit(&piece?.text)?;
        }
        emit("\n")?;
        let reply = tokenizer.decode(generation.tokens())?;
        messages.push(Message::new("assistant", &reply));
    }
    Ok(())
}
