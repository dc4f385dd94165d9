//! `tnn tokenize`: the token ids of a text, as llama.cpp's `llama-tokenize` prints them (one
//! `id -> 'piece'` line per token, or `--ids` for the list alone).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_models::model::Model;

#[derive(Args)]
pub struct TokenizeArgs {
    /// Model file or directory, or a model name: smollm2, gemma3 (default: smollm2).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// The text to tokenize.
    #[arg(short = 'p', long = "prompt", conflicts_with = "file")]
    pub prompt: Option<String>,
    /// A file holding the text to tokenize.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Print only the ids, as one list: `[1, 2, 3]`.
    #[arg(long)]
    pub ids: bool,
    /// Never prepend BOS (by default it is prepended when the model asks for it).
    #[arg(long = "no-bos")]
    pub no_bos: bool,
    /// Print the number of tokens at the end.
    #[arg(long = "show-count")]
    pub show_count: bool,
}

pub fn run(args: &TokenizeArgs) -> Result<()> {
    let text = match (&args.prompt, &args.file) {
        (Some(p), None) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?
        }
        _ => bail!("give the text with -p TEXT or -f FILE"),
    };
    let path = crate::models::resolve(args.model.as_deref())?;
    let model = Model::open(&path)?;
    let tokenizer = model.tokenizer()?;
    let ids = tokenizer.encode(&text, !args.no_bos)?;
    let mut out = String::new();
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        out.push_str(&format!("[{}]\n", list.join(", ")));
    } else {
        for &id in &ids {
            // As llama-tokenize prints them: the piece as it is, between single quotes.
            out.push_str(&format!("{id:6} -> '{}'\n", tokenizer.decode(&[id])?));
        }
    }
    if args.show_count {
        out.push_str(&format!("Total number of tokens: {}\n", ids.len()));
    }
    crate::generate::emit(&out)
}
