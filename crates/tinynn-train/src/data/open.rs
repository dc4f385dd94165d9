//! A data file opened by its extension: `.txt`, `.text`, `.md` or none (packed text), `.jsonl`
//! (chat samples, loss on the assistant's tokens), `.bin` (pre-tokenized little-endian i32 ids).

use std::path::Path;

use tinynn_models::chat::ChatTemplate;
use tinynn_models::tokenizer::Tokenizer;

use super::{BinTokens, ChatSamples, DataError, PackedText, Sequences};

/// What the text and chat sources tokenize with.
pub struct Tokenization<'a> {
    pub tokenizer: &'a Tokenizer,
    /// Needed for `.jsonl` only.
    pub template: Option<&'a ChatTemplate>,
    /// Token ids of `.bin` files must be below it.
    pub n_vocab: usize,
}

/// Whether `path` holds chat samples (`.jsonl`), which need a chat template.
pub fn is_chat(path: &Path) -> bool {
    extension(path) == "jsonl"
}

fn extension(path: &Path) -> String {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    ext.to_ascii_lowercase()
}

/// Opens `path` as a source of sequences of `seq` tokens, by its extension.
pub fn open(
    path: &Path,
    seq: usize,
    tok: &Tokenization<'_>,
) -> Result<Box<dyn Sequences>, DataError> {
    Ok(match extension(path).as_str() {
        // Files without an extension (LICENSE, GPL-3, README) are text too.
        "txt" | "text" | "md" | "" => {
            let Some(eos) = tok.tokenizer.eos() else {
                return Err(DataError::file(
                    path,
                    "the tokenizer has no end-of-text token to separate documents",
                ));
            };
            let paths = [path.to_path_buf()];
            Box::new(PackedText::from_files(&paths, tok.tokenizer, eos, seq)?)
        }
        "jsonl" => {
            let Some(template) = tok.template else {
                return Err(DataError::file(path, "chat data needs a chat template"));
            };
            Box::new(ChatSamples::from_jsonl(path, template, tok.tokenizer, seq)?)
        }
        "bin" => Box::new(BinTokens::open(&[path.to_path_buf()], seq, tok.n_vocab)?),
        _ => return Err(DataError::file(
            path,
            "unknown data format (expected text: .txt, .md or no extension; chat: .jsonl; token ids: .bin)",
        )),
    })
}
