//! tinynn-train: everything training needs on top of the engine's autograd
//! (`tinynn_core::graph::Graph::backward`): model training graphs, optimizers and learning-rate
//! schedules, data loading, checkpoints, and LoRA.
//!
//! Full fine-tuning of a Llama-family model: [`Trainer`] (`trainer.rs`) over the training
//! forward pass (`model.rs`), the parameters and their initial values (`params.rs`,
//! `source.rs`), the optimizers (`optim.rs`), the compiled passes (`passes.rs`) and the GGUF
//! export (`export.rs`).

pub mod error;
pub mod export;
pub mod model;
pub mod optim;
pub mod params;
mod passes;
pub mod source;
pub mod trainer;

pub use error::{Result, TrainError};
pub use optim::Optimizer;
pub use params::NamedTensor;
pub use source::TrainSource;
pub use trainer::{OptimizerState, StepReport, TrainConfig, Trainer};
