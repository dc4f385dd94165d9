//! Typed errors. Every error names what was wrong and where (file, byte offset, field).

use std::path::PathBuf;

/// A problem found while reading a GGUF byte buffer: at which byte, in which field, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at byte {offset} ({field}): {kind}")]
pub struct GgufError {
    /// Byte offset from the start of the file where the offending field begins.
    pub offset: u64,
    /// The field being read, e.g. `header.n_tensors` or `tensor[3] 'blk.0.attn_q.weight' dims[1]`.
    pub field: String,
    pub kind: GgufErrorKind,
}

/// What was wrong with a GGUF field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GgufErrorKind {
    #[error("file ends early: {needed} bytes needed, {available} left")]
    UnexpectedEof { needed: u64, available: u64 },
    #[error("not a GGUF file (magic bytes {found:02x?}, expected \"GGUF\")")]
    BadMagic { found: [u8; 4] },
    #[error("big-endian GGUF files are not supported")]
    BigEndian,
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error("count {count} is more than the {available} remaining bytes can hold ({min_item_bytes} bytes each at least)")]
    CountTooLarge {
        count: u64,
        available: u64,
        min_item_bytes: u64,
    },
    #[error("length {len} is more than the {available} bytes left in the file")]
    LengthTooLarge { len: u64, available: u64 },
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    #[error("boolean byte is {0}, expected 0 or 1")]
    InvalidBool(u8),
    #[error("unknown metadata value type {0}")]
    UnknownValueType(u32),
    #[error("arrays nested deeper than {max} levels")]
    NestingTooDeep { max: usize },
    #[error("key appears twice")]
    DuplicateKey,
    #[error("value must be {expected}, found {found}")]
    WrongValueType {
        expected: &'static str,
        found: &'static str,
    },
    #[error("alignment {0} is not a power of two between 1 and 1 MiB")]
    BadAlignment(u64),
    #[error("unknown tensor type id {0}")]
    UnknownTensorType(u32),
    #[error("tensor type id {id} ({name}) was removed from ggml and has no defined layout")]
    RemovedTensorType { id: u32, name: &'static str },
    #[error("{0} dimensions, at most 4 are allowed")]
    TooManyDims(u32),
    #[error("{0} dimensions, at least 1 is required")]
    NoDims(u32),
    #[error("dimension {index} is {value}; each must be between 1 and 2^63-1")]
    BadDim { index: usize, value: u64 },
    #[error("size arithmetic overflows 64 bits")]
    SizeOverflow,
    #[error("row length {ne0} is not a multiple of the {type_name} block size {block}")]
    NotBlockMultiple {
        ne0: u64,
        type_name: &'static str,
        block: u64,
    },
    #[error("name is {len} bytes long, at most {max} are allowed")]
    NameTooLong { len: u64, max: u64 },
    #[error("name is empty")]
    EmptyName,
    #[error("a tensor with this name appears twice")]
    DuplicateTensor,
    #[error("offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset { offset: u64, alignment: u64 },
    #[error("data [{start}, +{len}) does not fit in the {data_len}-byte data section")]
    TensorOutOfBounds { start: u64, len: u64, data_len: u64 },
    #[error("data overlaps the data of tensor '{other}'")]
    TensorsOverlap { other: String },
    #[error("data section would start at byte {start}, past the end of the {file_len}-byte file")]
    DataSectionPastEnd { start: u64, file_len: u64 },
}

impl GgufErrorKind {
    /// What the error suggests about the file, for the message a user sees: bytes missing at
    /// the end (a download or copy cut short), or bytes that no GGUF writer produces.
    pub fn hint(&self) -> &'static str {
        use GgufErrorKind::*;
        match self {
            UnexpectedEof { .. }
            | CountTooLarge { .. }
            | LengthTooLarge { .. }
            | TensorOutOfBounds { .. }
            | DataSectionPastEnd { .. } => {
                " (the file looks truncated: an interrupted download or copy? fetch it again)"
            }
            BadMagic { .. } | BigEndian | UnsupportedVersion { .. } => "",
            _ => " (the file looks damaged: fetch it again, or ask whoever made it)",
        }
    }

    /// The variant's name, stable for tests and machine-readable output.
    pub fn code(&self) -> &'static str {
        use GgufErrorKind::*;
        match self {
            UnexpectedEof { .. } => "UnexpectedEof",
            BadMagic { .. } => "BadMagic",
            BigEndian => "BigEndian",
            UnsupportedVersion { .. } => "UnsupportedVersion",
            CountTooLarge { .. } => "CountTooLarge",
            LengthTooLarge { .. } => "LengthTooLarge",
            InvalidUtf8 => "InvalidUtf8",
            InvalidBool { .. } => "InvalidBool",
            UnknownValueType { .. } => "UnknownValueType",
            NestingTooDeep { .. } => "NestingTooDeep",
            DuplicateKey => "DuplicateKey",
            WrongValueType { .. } => "WrongValueType",
            BadAlignment { .. } => "BadAlignment",
            UnknownTensorType { .. } => "UnknownTensorType",
            RemovedTensorType { .. } => "RemovedTensorType",
            TooManyDims { .. } => "TooManyDims",
            NoDims { .. } => "NoDims",
            BadDim { .. } => "BadDim",
            SizeOverflow => "SizeOverflow",
            NotBlockMultiple { .. } => "NotBlockMultiple",
            NameTooLong { .. } => "NameTooLong",
            EmptyName => "EmptyName",
            DuplicateTensor => "DuplicateTensor",
            MisalignedOffset { .. } => "MisalignedOffset",
            TensorOutOfBounds { .. } => "TensorOutOfBounds",
            TensorsOverlap { .. } => "TensorsOverlap",
            DataSectionPastEnd { .. } => "DataSectionPastEnd",
        }
    }
}

impl GgufError {
    pub(crate) fn new(offset: u64, field: impl Into<String>, kind: GgufErrorKind) -> Self {
        GgufError {
            offset,
            field: field.into(),
            kind,
        }
    }
}

/// Errors of this crate's file-level API: every variant names the file. The cause is part of the
/// message (not a separate `source()`), so printing an error chain never repeats it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}: {cause}", path.display())]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{}: invalid GGUF {cause}{}", path.display(), cause.kind.hint())]
    Gguf { path: PathBuf, cause: GgufError },
    #[error("{}: invalid safetensors file: {message}", path.display())]
    Safetensors { path: PathBuf, message: String },
    #[error("{}: invalid JSON at line {line} column {column}: {message}", path.display())]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("GGUF writer: {0}")]
    Write(String),
}

impl Error {
    /// An I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, cause: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            cause,
        }
    }

    pub(crate) fn invalid(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Invalid {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn json(path: impl Into<PathBuf>, e: &serde_json::Error) -> Self {
        // serde_json's Display appends " at line L column C"; keep only the message part.
        let full = e.to_string();
        let message = match full.rfind(" at line ") {
            Some(i) => full[..i].to_string(),
            None => full,
        };
        Error::Json {
            path: path.into(),
            line: e.line(),
            column: e.column(),
            message,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
