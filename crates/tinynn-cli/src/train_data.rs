//! Training data by file extension: `.txt` (packed text), `.jsonl` (chat samples, loss on the
//! assistant's tokens), `.bin` (pre-tokenized little-endian i32 ids).

use std::path::Path;

use anyhow::{bail, Result};
use tinynn_models::chat::ChatTemplate;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_train::data::{BinTokens, ChatSamples, PackedText, Sequences};

/// What the text and chat sources tokenize with.
pub struct Tokenization<'a> {
    pub tokenizer: &'a Tokenizer,
    /// Needed for `.jsonl` only.
    pub template: Option<&'a ChatTemplate>,
    pub n_vocab: usize,
}

/// Opens `path` as a source of sequences of `seq` tokens, by its extension.
pub fn open(path: &Path, seq: usize, tok: &Tokenization<'_>) -> Result<Box<dyn Sequences>> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    Ok(match ext.as_str() {
        // Files without an extension (LICENSE, GPL-3, README) are text too.
        "txt" | "text" | "md" | "" => {
            let Some(eos) = tok.tokenizer.eos() else {
                bail!("the tokenizer has no end-of-text token to separate documents");
            };
            Box::new(PackedText::from_files(
                &[path.to_path_buf()],
                tok.tokenizer,
                eos,
                seq,
            )?)
        }
        "jsonl" => {
            let Some(template) = tok.template else {
                bail!("{}: chat data needs a chat template", path.display());
            };
            Box::new(ChatSamples::from_jsonl(path, template, tok.tokenizer, seq)?)
        }
        "bin" => Box::new(BinTokens::open(&[path.to_path_buf()], seq, tok.n_vocab)?),
        _ => bail!(
            "{}: unknown data format (expected text: .txt, .md or no extension; chat: .jsonl; token ids: .bin)",
            path.display()
        ),
    })
}
