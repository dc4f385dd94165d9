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
    /// The prompt (default: "The capital of France is"). Escapes (\n, \t, \\, \", \') are
    /// processed as llama.cpp does, unless --no-escape.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from FILE (`-` for standard input), as it is.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Take -p's backslashes literally (no escape processing).
    #[arg(long = "no-escape")]
    pub no_escape: bool,
    /// Process escapes in -p (the default; kept for llama.cpp's spelling).
    #[arg(short = 'e', long = "escape", conflicts_with = "no_escape")]
    pub escape: bool,
    /// Print only the generated text, not the prompt before it.
    #[arg(long = "no-display-prompt")]
    pub no_display_prompt: bool,
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
    #[command(flatten)]
    pub template: crate::chat_template_args::ChatTemplateArgs,
    /// Keep generating past the end-of-text token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Write the last decode step's per-op, per-thread timings to FILE (Chrome trace JSON,
    /// for chrome://tracing or Perfetto).
    #[arg(long = "trace", value_name = "FILE")]
    pub trace: Option<PathBuf>,
}

/// The prompt text: -p's (escapes processed unless --no-escape), -f's file or standard input,
/// or the default.
fn prompt_text(args: &RunArgs) -> Result<String> {
    if let Some(p) = &args.prompt {
        return Ok(if args.no_escape {
            p.clone()
        } else {
            process_escapes(p)
        });
    }
    match &args.file {
        Some(f) if f.as_os_str() == "-" => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
                .context("reading the prompt from standard input")?;
            Ok(text)
        }
        Some(f) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt file {}", f.display())),
        None => Ok("The capital of France is".to_string()),
    }
}

/// llama.cpp's escapes: `\n`, `\r`, `\t`, `\'`, `\"`, `\\`, `\xHH`; any other backslash
/// stays as it is.
fn process_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        let simple = match chars.peek() {
            Some('n') => Some('\n'),
            Some('r') => Some('\r'),
            Some('t') => Some('\t'),
            Some('\'') => Some('\''),
            Some('"') => Some('"'),
            Some('\\') => Some('\\'),
            _ => None,
        };
        if let Some(e) = simple {
            out.push(e);
            chars.next();
            continue;
        }
        if chars.peek() == Some(&'x') {
            let hex: String = chars.clone().skip(1).take(2).collect();
            if hex.len() == 2 && hex.chars().all(|h| h.is_ascii_hexdigit()) {
                let b = u8::from_str_radix(&hex, 16).unwrap_or(0x80);
                if b.is_ascii() {
                    out.push(b as char);
                    chars.nth(2);
                    continue;
                }
            }
        }
        out.push('\\');
    }
    out
}

pub fn run(args: &RunArgs) -> Result<()> {
    let prompt_text = prompt_text(args)?;
    let model = args.model.open()?;
    let opts = args.model.exec_options();
    let mut session =
        args.model
            .session(model.clone(), args.lora.applied()?, args.trace.is_some())?;
    let text = if args.chat {
        let template = crate::chat::template(&model, &args.template)?;
        let mut messages = Vec::new();
        if let Some(sys) = &args.system {
            messages.push(Message::new("system", sys));
        }
        messages.push(Message::new("user", &prompt_text));
        template.render(&messages, true)?
    } else {
        prompt_text.clone()
    };
    let prompt = model.tokenizer()?.encode(&text, true)?;
    if !args.chat && !args.no_display_prompt {
        emit(&prompt_text)?;
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

#[cfg(test)]
mod tests {
    use super::process_escapes;

    #[test]
    fn escapes_as_llama_cpp_processes_them() {
        assert_eq!(process_escapes(r"a\nb\tc"), "a\nb\tc");
        assert_eq!(process_escapes(r#"\"q\" \'s\' \\n"#), "\"q\" 's' \\n");
        assert_eq!(process_escapes(r"\x41\x7e!"), "A~!");
        // Unknown or unfinished escapes stay as written.
        assert_eq!(
            process_escapes(r"\q \x4 \xZZ \x+1 \xff end\"),
            r"\q \x4 \xZZ \x+1 \xff end\"
        );
        assert_eq!(process_escapes("plain é"), "plain é");
    }
}
