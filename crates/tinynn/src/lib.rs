//! # tinynn
//!
//! Run, fine-tune and serve transformer language models on the CPU, from the files people
//! already have: GGUF (quantized, from the llama.cpp world) and Hugging Face safetensors
//! directories. This crate is the library's front door: it re-exports what an application
//! needs, and the workspace crates behind it stay reachable as modules for deeper work.
//!
//! ```no_run
//! use tinynn::{GenerateOptions, Model, Session};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = Model::open("SmolLM2-135M-Instruct.Q4_1.gguf")?; // Arc<Model>
//! let mut session = Session::new(model, 2048, tinynn::ExecOptions::default())?;
//! let mut generation = session.generate_text("The capital of France is", &GenerateOptions::default())?;
//! for piece in generation.by_ref() {
//!     print!("{}", piece?.text);
//! }
//! println!(" ({:?})", generation.finish_reason());
//! # Ok(())
//! # }
//! ```
//!
//! - [`Model`]: an opened model, owned and shared (`Arc`) by any number of sessions.
//! - [`Session`]: a KV cache of up to 64 sequences; [`Session::decode`] runs a ragged batch of
//!   tokens from several sequences in one plan run; [`Session::generate`] /
//!   [`Session::generate_text`] / [`Session::chat`] stream text; [`Session::embed_texts`]
//!   gives embeddings; [`perplexity`] scores a text.
//! - [`Trainer`] and [`fit`]: full fine-tuning, LoRA and QLoRA, with checkpoints and resume.
//!
//! The examples in `crates/tinynn/examples/` run each of these on the default model
//! (SmolLM2-135M-Instruct Q4_1, fetched by [`default_model`]).

#![warn(missing_docs)]

pub use tinynn_cpu::ExecOptions;
pub use tinynn_models::chat::{ChatTemplate, Message};
pub use tinynn_models::embed::Pooling;
pub use tinynn_models::generate::{Finish, GenerateOptions, Generation, Piece};
pub use tinynn_models::lora::{AppliedLora, LoraAdapter};
pub use tinynn_models::model::Model;
pub use tinynn_models::perplexity::{perplexity, Perplexity};
pub use tinynn_models::sampling::{Penalties, Sampler, Strategy};
pub use tinynn_models::session::{argmax, BatchToken, Session, SessionOptions};
pub use tinynn_models::{ModelError, Result};
pub use tinynn_train::{
    fit, LoopConfig, LoopObserver, LoopOutcome, LoraConfig, Targets, TrainConfig, TrainError,
    Trainer,
};

/// Model files: GGUF and safetensors readers and writers, configs, the model cache.
pub use tinynn_format as format;

/// The numeric core: quantization formats, tensors, the op enum, graphs and plans.
pub use tinynn_core as core;

/// The CPU backend: thread pool, memory, executor, kernels.
pub use tinynn_cpu as cpu;

/// Architectures, tokenizers, sessions, sampling, chat templates, quantization.
pub use tinynn_models as models;

/// Training: trainer, optimizers, data, checkpoints, the training loop.
pub use tinynn_train as train;

pub mod graph_program;
pub mod pull;

/// The default model's path (SmolLM2-135M-Instruct Q4_1) in the model cache (`$TINYNN_CACHE`,
/// else `$XDG_CACHE_HOME/tinynn`, else `~/.cache/tinynn`). The library never downloads: when
/// the file is missing the error says to run `tnn pull smollm2` (or call [`pull::pull`]).
pub fn default_model() -> std::result::Result<std::path::PathBuf, format::Error> {
    format::model_cache::require_default_model()
}
