//! Data errors: every one names the file and the line or byte offset where it applies.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// Something wrong with the file as a whole (empty, not UTF-8, length not a multiple of 4,
    /// too few tokens).
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    /// A JSONL line that is not a valid chat sample, or that the template or tokenizer refused.
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// A token id of a pre-tokenized file outside the vocabulary.
    #[error("{}: byte {offset}: token id {id} is outside the vocabulary of {vocab} tokens", path.display())]
    TokenOutOfRange {
        path: PathBuf,
        offset: u64,
        id: i64,
        vocab: usize,
    },
    /// Invalid settings (batch 0, an eval split leaving no training data, a position past the
    /// end, ...).
    #[error("data: {0}")]
    Config(String),
}

impl DataError {
    pub(crate) fn io(path: &std::path::Path, cause: std::io::Error) -> Self {
        DataError::Io {
            path: path.to_path_buf(),
            cause,
        }
    }

    pub(crate) fn file(path: &std::path::Path, message: impl Into<String>) -> Self {
        DataError::File {
            path: path.to_path_buf(),
            message: message.into(),
        }
    }

    pub(crate) fn line(path: &std::path::Path, line: usize, message: impl Into<String>) -> Self {
        DataError::Line {
            path: path.to_path_buf(),
            line,
            message: message.into(),
        }
    }
}
