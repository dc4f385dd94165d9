//! Token strings from GGUF metadata, turned back into bytes: GPT-2 byte-level BPE vocabularies
//! (`tokenizer.ggml.model = gpt2`) map each byte to a printable character; SentencePiece ones
//! (`llama`) use `▁` for spaces and `<0xXX>` tokens for raw bytes.

use tinynn_format::gguf::{Array, Gguf, Key};

use crate::{ModelError, Result};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    ByteLevelBpe,
    SentencePiece,
    /// WordPiece (`##` marks a piece that continues a word; other pieces start one).
    WordPiece,
    /// Pieces that are their own text.
    Plain,
}

pub struct Vocab {
    kind: VocabKind,
    tokens: Vec<Vec<u8>>,
}

/// GPT-2's byte ↔ character table: printable bytes map to themselves, the rest to U+0100 on.
fn byte_of_char(c: char) -> Option<u8> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let code = c as u32;
    if printable(code) {
        return Some(code as u8);
    }
    // The n-th non-printable byte (in byte order) is U+0100 + n.
    let n = code.checked_sub(0x100)?;
    (0u32..256)
        .filter(|&b| !printable(b))
        .nth(n as usize)
        .map(|b| b as u8)
}

impl Vocab {
    pub fn from_gguf(g: &Gguf) -> Result<Vocab> {
        let kind = match g.get_str(Key::TokenizerModel)? {
            Some("gpt2") => VocabKind::ByteLevelBpe,
            Some("llama") => VocabKind::SentencePiece,
            other => {
                return Err(ModelError::Invalid(format!(
                    "tokenizer model {other:?} is not supported yet"
                )))
            }
        };
        let Some(Array::String(list)) = g.get_array(Key::TokenizerTokens)? else {
            return Err(ModelError::Invalid(
                "tokenizer.ggml.tokens is missing or not a string array".into(),
            ));
        };
        let tokens = list.iter().map(|t| t.as_bytes().to_vec()).collect();
        Ok(Vocab { kind, tokens })
    }

    /// From token strings by id (a `tokenizer.json`'s vocabulary) of the kind its decoder
    /// declares ([`crate::tokenizer::Tokenizer::vocab_kind`]).
    pub fn from_strings(tokens: Vec<String>, kind: VocabKind) -> Vocab {
        Vocab {
            kind,
            tokens: tokens.into_iter().map(String::into_bytes).collect(),
        }
    }

    pub fn kind(&self) -> VocabKind {
        self.kind
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The bytes token `id` stands for (empty for an unknown id).
    pub fn token_bytes(&self, id: u32) -> Vec<u8> {
        let Some(raw) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let text = String::from_utf8_lossy(raw);
        match self.kind {
            VocabKind::ByteLevelBpe => text
                .chars()
                .map(|c| byte_of_char(c).unwrap_or(b'?'))
                .collect(),
            VocabKind::SentencePiece => {
                if let Some(hex) = text.strip_prefix("<0x").and_then(|t| t.strip_suffix('>')) {
                    if let Ok(b) = u8::from_str_radix(hex, 16) {
                        return vec![b];
                    }
                }
                text.replace('\u{2581}', " ").into_bytes()
            }
            VocabKind::WordPiece => match text.strip_prefix("##") {
                Some(rest) => rest.as_bytes().to_vec(),
                None => format!(" {text}").into_bytes(),
            },
            VocabKind::Plain => raw.clone(),
        }
    }

    /// The bytes of a token sequence.
    pub fn decode(&self, ids: &[u32]) -> Vec<u8> {
        ids.iter().flat_map(|&id| self.token_bytes(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_byte_table() {
        assert_eq!(byte_of_char('A'), Some(b'A'));
        assert_eq!(byte_of_char('\u{120}'), Some(b' ')); // 'Ġ'
        assert_eq!(byte_of_char('\u{10a}'), Some(b'\n')); // 'Ċ'
        assert_eq!(byte_of_char('\u{100}'), Some(0));
    }
}
