//! The names the Llama-family inference graph had before the architecture seam, kept for
//! callers: the graph itself is `crate::forward` (any registered architecture), the block
//! `crate::arch::llama`, the hyperparameters `crate::arch::hparams`.

pub use crate::arch::hparams::Hparams;
pub use crate::common::rope::llama3_freq_factors;
pub use crate::forward::{forward_graph, ForwardGraph, GraphSpec};
