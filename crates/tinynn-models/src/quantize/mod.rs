//! Model quantization (`tnn quantize`): a GGUF file in, a GGUF file of another type out.
//!
//! - [`target`]: the whole-file targets (F16, Q8_0, Q4_K_M, ...) and their `general.file_type`.
//! - [`policy`]: which type each tensor gets (llama.cpp's rules; where they differ by
//!   architecture, its registry line's `quantize` in `crate::arch::REGISTRY`).
//! - [`convert`]: one tensor's rows, dequantized and quantized with the reference kernels, in
//!   parallel.
//! - [`file`](mod@file): the whole file: plan, requantization check, conversion, atomic write.

pub mod convert;
pub mod file;
pub mod policy;
pub mod target;

pub use file::{plan, quantize_file, Options, Progress, Report, TensorPlan};
pub use target::Target;

use tinynn_format::GgmlType;

/// Why a file could not be quantized.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Format(#[from] tinynn_format::Error),
    #[error(transparent)]
    Gguf(#[from] tinynn_format::GgufError),
    #[error(
        "architecture '{0}': tnn quantize knows the tensor rules of {known} only",
        known = crate::arch::names(|a| a.quantize.is_some())
    )]
    Architecture(String),
    #[error("{0}")]
    Model(String),
    #[error(
        "the model is already quantized ({}); quantizing it again adds a second quantization \
         error to the first (quality loss), so it needs --allow-requantize",
        types.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    )]
    Requantize { types: Vec<GgmlType> },
    #[error("cannot write {}: {cause}", path.display())]
    Write {
        path: std::path::PathBuf,
        cause: tinynn_format::Error,
    },
    #[error("tensor '{tensor}': {cause}")]
    Tensor { tensor: String, cause: String },
    /// The output's folder is missing (checked before any work).
    #[error("cannot write {}: {} is not a directory", path.display(), dir.display())]
    NoOutputDir {
        path: std::path::PathBuf,
        dir: std::path::PathBuf,
    },
}
