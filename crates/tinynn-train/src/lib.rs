//! tinynn-train: everything training needs on top of the engine's autograd
//! (`tinynn_core::graph::Graph::backward`): model training graphs, optimizers and learning-rate
//! schedules, data loading, checkpoints, and LoRA.
//!
//! Full fine-tuning of a model of any architecture `tinynn_models::arch` lets train:
//! [`Trainer`] (`trainer.rs`) over the training forward pass (`model.rs`: the architecture's
//! decoder on the trainer's leaves, `leaves.rs`), the parameters and their initial values
//! (`params.rs`, `source.rs`), the optimizers (`optim.rs`), the compiled passes (`passes.rs`)
//! and the GGUF export (`export.rs`).
//!
//! - [`schedule`]: learning-rate schedules; [`ema`]: weight averages; [`rng`]: a serializable RNG.
//! - [`data`]: packed text, JSONL chat (loss on assistant tokens), streamed `.bin` tokens, and
//!   the resumable [`data::Batcher`].
//! - [`checkpoint`]: one atomic GGUF file per checkpoint, a `latest` pointer, fallback on load.
//! - [`collective`]: data-parallel training: the reductions across ranks ([`collective::Collective`]),
//!   one process alone, a group of threads; the `tnn` command line brings MPI.
//! - [`metrics`]: the JSONL metrics log; [`plot`]: the loss-curve PNG.
//! - [`lora`]: LoRA / QLoRA adapters (`TrainConfig::lora`): targets, init, merge, and the
//!   llama.cpp GGUF adapter format.
//! - [`train_loop`]: the whole training loop, [`fit`] (schedule, eval, checkpoints, resume,
//!   metrics, non-finite stop, loss curve, export), driven by plain settings
//!   ([`LoopConfig`]), a stop flag and a [`LoopObserver`].

pub mod checkpoint;
pub mod collective;
pub mod data;
pub mod dir_lock;
pub mod ema;
pub mod error;
pub mod export;
mod grad_reduce;
mod int8_backward;
mod leaves;
pub mod lora;
pub mod metrics;
pub mod model;
pub mod optim;
pub mod params;
mod passes;
pub mod plot;
pub mod rng;
pub mod schedule;
pub mod scratch;
pub mod source;
mod tensor_io;
pub mod train_loop;
pub mod trainer;

pub use error::{Result, TrainError};
pub use grad_reduce::{BUCKET, OVERLAP_BYTES};
pub use lora::{LoraConfig, Targets};
pub use optim::Optimizer;
pub use params::NamedTensor;
pub use source::TrainSource;
pub use train_loop::{fit, fit_data_parallel, LoopConfig, LoopObserver, LoopOutcome};
pub use trainer::{FrozenSpec, OptimizerState, StepReport, TrainConfig, TrainMemory, Trainer};
