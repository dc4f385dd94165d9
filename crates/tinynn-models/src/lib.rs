//! tinynn-models: transformer architectures as graphs, from a typed [`ModelConfig`] and the
//! weights of a GGUF file or an HF directory.
//!
//! - [`common`]: the pieces blocks are made of (linear with LoRA, norms, MLPs, RoPE, attention
//!   over a KV cache or whole sequences) and [`common::Leaves`], where a block's tensors come
//!   from (inference: the file; training: the trainer's parameters).
//! - [`arch`]: the registry of supported architectures and their decoders (`arch/llama.rs`:
//!   Llama 2/3, SmolLM, Mistral, Qwen2, Qwen3), each written once for inference and training.
//! - [`forward`]: the inference graph (KV cache, logits or hidden states); [`llama`] keeps its
//!   old names.
//! - [`lora`]: LoRA adapters (llama.cpp's GGUF format) applied at inference.
//! - [`session`]: a model bound to an executor with its KV cache; one decode step per token.
//! - [`vocab`]: token strings from GGUF metadata and byte-level (GPT-2 style) detokenization.
//!
//! [`ModelConfig`]: tinynn_format::model_config::ModelConfig

pub mod arch;
pub mod bench;
pub mod chat;
pub mod common;
pub mod convert;
pub mod embed;
pub mod forward;
pub mod generate;
pub mod inspect;
pub mod inspect_text;
pub mod kv_cells;
pub mod llama;
pub mod lora;
pub mod model;
pub mod perplexity;
pub mod quantize;
pub mod sampling;
pub mod session;
pub mod stop;
pub mod tokenizer;
pub mod vocab;
pub mod weights;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] tinynn_format::Error),
    // The causes of `Config` and `Graph` are in their messages, not their sources: a
    // report that walks the source chain would say them twice.
    #[error("model config: {0}")]
    Config(tinynn_format::model_config::ConfigError),
    #[error(transparent)]
    Gguf(#[from] tinynn_format::GgufError),
    #[error("building the graph: {0}")]
    Graph(tinynn_core::graph::GraphError),
    /// A backend's error (whatever backend runs the session).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    #[error("tensor '{0}' is missing from the model file")]
    MissingTensor(String),
    #[error("tensor '{name}' has shape {got:?}, the config implies {want:?}")]
    TensorShape {
        name: String,
        got: Vec<u64>,
        want: Vec<u64>,
    },
    #[error(
        "architecture '{0}' is not supported yet (supported: {known})",
        known = crate::arch::names(|_| true)
    )]
    UnsupportedArchitecture(String),
    #[error(
        "architecture '{0}' cannot be trained yet (trainable: {known})",
        known = crate::arch::names(|a| a.train)
    )]
    NotTrainable(String),
    #[error("the context is full: {0} tokens")]
    ContextFull(usize),
    #[error("{0}")]
    Invalid(String),
}

impl From<tinynn_format::model_config::ConfigError> for ModelError {
    fn from(e: tinynn_format::model_config::ConfigError) -> Self {
        ModelError::Config(e)
    }
}

impl From<tinynn_core::graph::GraphError> for ModelError {
    fn from(e: tinynn_core::graph::GraphError) -> Self {
        ModelError::Graph(e)
    }
}

pub type Result<T> = std::result::Result<T, ModelError>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A report that prints a message, then its source chain, says each cause once.
    fn report(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cause = e.source();
        while let Some(c) = cause {
            s += &format!(": {c}");
            cause = c.source();
        }
        s
    }

    #[test]
    fn causes_are_said_once() {
        let config = ModelError::from(tinynn_format::model_config::ConfigError::Missing(
            "n_embd".into(),
        ));
        assert_eq!(report(&config), "model config: missing n_embd");
        let mut g = tinynn_core::graph::Graph::new();
        let a = g.input("a", tinynn_format::GgmlType::F32, &[4]).unwrap();
        let b = g.input("b", tinynn_format::GgmlType::F32, &[5]).unwrap();
        let e = ModelError::from(g.add(a, b).unwrap_err());
        let text = report(&e);
        assert!(text.starts_with("building the graph: "), "{text}");
        let cause = text.trim_start_matches("building the graph: ");
        assert_eq!(text.matches(cause).count(), 1, "{text}");
    }
}
