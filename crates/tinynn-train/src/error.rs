//! The training crate's error type.

use tinynn_core::graph::GraphError;

/// Why a trainer could not be built, fed, run or saved.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] tinynn_models::ModelError),
    #[error("building the training graph: {0}")]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Memory(#[from] tinynn_cpu::MemoryError),
    #[error(transparent)]
    Exec(#[from] tinynn_cpu::ExecError),
    #[error(transparent)]
    Format(#[from] tinynn_format::Error),
    #[error("dequantizing '{name}': {message}")]
    Dequantize { name: String, message: String },
    #[error("parameter '{name}': {message}")]
    Param { name: String, message: String },
    #[error("batch: {0}")]
    Batch(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0} is not supported")]
    Unsupported(String),
}

pub type Result<T> = std::result::Result<T, TrainError>;
