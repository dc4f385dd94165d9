//! Plain text: each file is a document; documents are tokenized, each followed by EOS, joined
//! into one stream and cut into sequences of `seq` inputs whose labels are the next tokens. The
//! last sequence is padded.

use std::path::{Path, PathBuf};

use super::source::{fill_window, Encode, Sequences, SourceStats};
use super::DataError;

pub struct PackedText {
    tokens: Vec<u32>,
    seq: usize,
}

impl PackedText {
    /// Reads and tokenizes `paths` (UTF-8 text; an empty file is an error).
    pub fn from_files(
        paths: &[PathBuf],
        encoder: &dyn Encode,
        eos: u32,
        seq: usize,
    ) -> Result<PackedText, DataError> {
        let mut docs = Vec::with_capacity(paths.len());
        for p in paths {
            let bytes = std::fs::read(p).map_err(|e| DataError::io(p, e))?;
            let text = String::from_utf8(bytes).map_err(|e| {
                DataError::file(
                    p,
                    format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()),
                )
            })?;
            if text.trim().is_empty() {
                return Err(DataError::file(p, "the file is empty"));
            }
            docs.push((p.as_path(), text));
        }
        Self::from_documents(docs, encoder, eos, seq)
    }

    /// Documents given as (name for errors, text).
    pub fn from_documents<'p>(
        docs: impl IntoIterator<Item = (&'p Path, String)>,
        encoder: &dyn Encode,
        eos: u32,
        seq: usize,
    ) -> Result<PackedText, DataError> {
        if seq == 0 {
            return Err(DataError::Config(
                "sequence length must be at least 1".into(),
            ));
        }
        let mut tokens = Vec::new();
        let mut last = PathBuf::new();
        for (path, text) in docs {
            let ids = encoder
                .encode(&text)
                .map_err(|m| DataError::file(path, format!("tokenizing: {m}")))?;
            tokens.extend_from_slice(&ids);
            tokens.push(eos);
            last = path.to_path_buf();
        }
        if tokens.len() < 2 {
            return Err(DataError::file(
                &last,
                "too little text: at least 2 tokens are needed",
            ));
        }
        Ok(PackedText { tokens, seq })
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
}

impl std::fmt::Debug for PackedText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedText")
            .field("tokens", &self.tokens.len())
            .field("seq", &self.seq)
            .finish()
    }
}

impl Sequences for PackedText {
    fn len(&self) -> usize {
        (self.tokens.len() - 1).div_ceil(self.seq)
    }

    fn seq_len(&self) -> usize {
        self.seq
    }

    fn read(&self, i: usize, inputs: &mut [i32], labels: &mut [i32]) -> Result<(), DataError> {
        if i >= self.len() {
            return Err(DataError::Config(format!(
                "sequence {i} of {} does not exist",
                self.len()
            )));
        }
        let start = i * self.seq;
        let end = (start + self.seq + 1).min(self.tokens.len());
        fill_window(&self.tokens[start..end], |_| true, inputs, labels);
        Ok(())
    }

    fn stats(&self) -> SourceStats {
        let n = self.tokens.len() - 1;
        SourceStats {
            sequences: self.len(),
            tokens: self.tokens.len() as u64,
            padded: (self.len() * self.seq - n) as u64,
            ..SourceStats::default()
        }
    }
}
