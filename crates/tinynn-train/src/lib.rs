//! tinynn-train: everything training needs on top of the engine's autograd
//! (`tinynn_core::graph::Graph::backward`): model training graphs, optimizers and learning-rate
//! schedules, data loading, checkpoints, and LoRA.

pub mod checkpoint;
pub mod data;
pub mod ema;
pub mod rng;
pub mod schedule;

mod atomic;
