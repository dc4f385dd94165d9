//! The pieces transformer blocks are made of, each written once for inference and training.
//!
//! A block asks a [`Leaves`] for its tensors by GGUF name — inference binds the model file's
//! weights (any type) and a LoRA adapter's A/B, training hands out its F32 parameters or frozen
//! base tensors and makes trainable LoRA branches — and builds the same ops either way.
//!
//! - [`leaves`]: the [`Leaves`] trait and [`Init`] (how a fresh model starts a tensor).
//! - [`linear`]: [`Linear`], `W·x (+ b)` for a weight of any type, with an optional LoRA branch.
//! - [`norm`]: RMSNorm and LayerNorm, `norm(x)·w (+ b)`.
//! - [`mlp`]: SwiGLU, GeGLU and plain GELU feed-forwards.
//! - [`moe`]: a mixture-of-experts feed-forward (Mixtral).
//! - [`rope`]: RoPE parameters from a config (mode, scaling, frequency factors), and RoPE itself.
//! - [`attention`]: attention over the KV cache (inference) or over whole sequences (training).
//! - [`recurrent`]: a recurrent layer's state (Mamba), kept per sequence slot at inference.

pub mod attention;
pub mod leaves;
pub mod linear;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod recurrent;
pub mod rope;

pub use attention::{Attention, AttnMode, AttnParams, KvCache};
pub use leaves::{Init, Leaves};
pub use linear::{rows_of, Dropout, Linear, LoraBranch};
pub use mlp::{Mlp, MlpKind};
pub use moe::Moe;
pub use norm::{Norm, NormKind};
pub use recurrent::{LayerState, StateDims, StateInputs};
pub use rope::RopeInputs;
