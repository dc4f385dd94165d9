//! tinynn-cpu: the CPU backend. A [`Plan`](tinynn_core::plan::Plan) runs on an [`Executor`]
//! (persistent thread pool + one arena) against a [`Memory`] (bound weights and persistent
//! tensors). Kernels live in `kernels/`, one file per op family.

mod backend;
mod executor;
pub mod huge_slab;
mod kernels;
mod memory;
pub mod plan_work;
pub mod pool;
pub mod simd;

/// Weights repacked for the matrix kernels (they live with the other SIMD code).
pub use simd::packed;

pub use executor::{barriers, ExecError, ExecOptions, Executor};
pub use memory::{AlignedBuf, Memory, MemoryError};
pub use plan_work::compile;
pub use tinynn_core::backend::{Backend, WeightRef, WeightStore};
