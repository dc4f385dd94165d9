//! tinynn-format: the model files users already have, read without trusting them.
//!
//! - [`gguf`]: GGUF v2/v3 reader over an mmap (zero-copy tensor views) and atomic writer.
//! - [`safetensors`]: safetensors files (single or sharded) over an mmap.
//! - [`hf_config`]: Hugging Face `config.json`; [`model_dir`]: a HF model directory.
//! - [`model_config`]: the architecture hyperparameters, from GGUF metadata or `config.json`.
//!
//! Nothing here panics on input: every error is typed and names the file, byte offset and field.

pub mod atomic_file;
mod cursor;
pub mod error;
pub mod ggml_type;
pub mod gguf;
pub mod hf_config;
pub mod mmap;
pub mod model_cache;
pub mod model_config;
pub mod model_dir;
pub mod safetensors;
pub mod safetensors_writer;

pub mod malformed_corpus;

pub use error::{Error, GgufError, GgufErrorKind, Result};
pub use ggml_type::{BlockLayout, GgmlType};
