//! `tnn chat`: an interactive multi-turn conversation. Each turn renders the whole conversation
//! with the chat template and evaluates only what the cache does not hold. At a terminal it has
//! line editing and history (`chat_input`), `/` commands, and Ctrl-C stops a reply; from a pipe
//! it reads one message per line (the same commands work) and prints only the replies.

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_models::chat::{ChatTemplate, Message};
use tinynn_models::model::Model;

use crate::chat_input::{Command, Input, Reader, HELP};
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
    /// Keep no history of typed lines (by default it is kept in the cache folder, as
    /// chat_history.txt).
    #[arg(long = "no-history")]
    pub no_history: bool,
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

/// Set while a reply is being generated: Ctrl-C then stops the reply instead of the program.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during a reply; the generation loop stops at the next token.
static STOP_REPLY: AtomicBool = AtomicBool::new(false);

/// Ctrl-C during a reply stops it (a second one, before the reply has stopped, quits); at any
/// other time it quits as usual (130). At a terminal the line editor reads Ctrl-C as a key, so
/// this handler sees only the ones pressed during a reply.
fn install_interrupt_handler() {
    let _ = ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) && !STOP_REPLY.swap(true, Ordering::SeqCst) {
            return;
        }
        std::process::exit(130);
    });
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
    let system: Vec<Message> = args
        .system
        .iter()
        .map(|s| Message::new("system", s))
        .collect();
    let mut messages = system.clone();
    let history = (!args.no_history)
        .then(tinynn_format::model_cache::cache_root)
        .flatten()
        .map(|r| r.join("chat_history.txt"));
    let mut reader = Reader::new(history)?;
    let interactive = reader.interactive();
    install_interrupt_handler();
    if interactive {
        eprintln!("tnn chat: type a message and press Enter; /help lists the commands, Ctrl-D or /exit quits.");
    }
    loop {
        let text = match reader.next()? {
            Input::Eof => break,
            Input::Command(Command::Exit) => break,
            Input::Command(Command::Help) => {
                eprintln!("{HELP}");
                continue;
            }
            Input::Command(Command::Clear) => {
                messages.clone_from(&system);
                eprintln!("(conversation cleared)");
                continue;
            }
            Input::Command(Command::Save(file)) => {
                match save(&file, &messages) {
                    Ok(()) => eprintln!("(saved {} messages to {file})", messages.len()),
                    Err(e) if interactive => eprintln!("error: {e:#}"),
                    Err(e) => return Err(e),
                }
                continue;
            }
            Input::Command(Command::Unknown(c)) => {
                eprintln!("unknown command {c:?}; /help lists them (// sends a message that starts with /)");
                continue;
            }
            Input::Message(text) => text,
        };
        messages.push(Message::new("user", &text));
        let turn = (|| -> Result<(String, bool)> {
            let prompt = tokenizer.encode(&template.render(&messages, true)?, true)?;
            if prompt.len() >= args.model.ctx {
                bail!(
                    "the conversation is {} tokens, the context {}: /clear to start over, or \
                     give a larger -c",
                    prompt.len(),
                    args.model.ctx
                );
            }
            STOP_REPLY.store(false, Ordering::SeqCst);
            GENERATING.store(true, Ordering::SeqCst);
            let mut generation = session.generate_with(&prompt, &opts, &mut sampler)?;
            let mut reply = String::new();
            let mut stopped = false;
            for piece in generation.by_ref() {
                if STOP_REPLY.load(Ordering::SeqCst) {
                    stopped = true;
                    break;
                }
                let piece = piece?;
                emit(&piece.text)?;
                reply.push_str(&piece.text);
            }
            Ok((reply, stopped))
        })();
        GENERATING.store(false, Ordering::SeqCst);
        match turn {
            Ok((reply, stopped)) => {
                emit("\n")?;
                if stopped {
                    eprintln!("(reply stopped)");
                }
                // The reply as it was printed: the same text the user saw is what the model
                // sees next turn and what /save writes.
                messages.push(Message::new("assistant", &reply));
            }
            Err(e) => {
                messages.pop();
                if !interactive {
                    return Err(e);
                }
                emit("\n")?;
                eprintln!("error: {e:#}");
            }
        }
    }
    Ok(())
}

/// Writes the conversation as a JSON array of `{"role", "content"}` objects (the OpenAI
/// messages form, which `tnn finetune` reads as one line of a .jsonl file).
fn save(file: &str, messages: &[Message]) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Saved<'a> {
        role: &'a str,
        content: &'a str,
    }
    let json: Vec<Saved> = messages
        .iter()
        .map(|m| Saved {
            role: &m.role,
            content: &m.content,
        })
        .collect();
    let text = serde_json::to_string_pretty(&json)? + "\n";
    let path = std::path::Path::new(file);
    tinynn_format::atomic_file::write_atomic(path, |w, tmp| {
        w.write_all(text.as_bytes())
            .map_err(|e| tinynn_format::Error::io(tmp, e))
    })
    .with_context(|| format!("saving the conversation to {file}"))
}
