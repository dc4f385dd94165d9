//! tinynn-train: everything training needs on top of the engine's autograd
//! (`tinynn_core::graph::Graph::backward`): model training graphs, optimizers and learning-rate
//! schedules, data loading, checkpoints, and LoRA.
//!
//! - [`schedule`]: learning-rate schedules; [`ema`]: weight averages; [`rng`]: a serializable RNG.
//! - [`data`]: packed text, JSONL chat (loss on assistant tokens), streamed `.bin` tokens, and
//!   the resumable [`data::Batcher`].
//! - [`checkpoint`]: one atomic GGUF file per checkpoint, a `latest` pointer, fallback on load.
//! - [`metrics`]: the JSONL metrics log; [`plot`]: the loss-curve PNG.

pub mod checkpoint;
pub mod data;
pub mod ema;
pub mod metrics;
pub mod plot;
pub mod rng;
pub mod schedule;

mod atomic;
