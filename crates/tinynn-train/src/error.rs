//! The training crate's error type.

use std::path::PathBuf;

use tinynn_core::graph::GraphError;

/// Why a trainer could not be built, fed, run or saved, or why the training loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] tinynn_models::ModelError),
    #[error("building the training graph: {0}")]
    Graph(#[from] GraphError),
    /// The backend's error (whatever backend runs the trainer: memory, runs, reads).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
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
    /// A collective operation across the ranks of a data-parallel run failed, or the ranks
    /// disagree (`collective::agree`).
    #[error("data-parallel training: {0}")]
    Collective(String),
    /// The training data (reading a batch, the held-out split, a restored position).
    #[error(transparent)]
    Data(#[from] crate::data::DataError),
    /// Writing or loading a checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The metrics log.
    #[error(transparent)]
    Metrics(#[from] crate::metrics::MetricsError),
    /// A learning-rate schedule that does not hold together.
    #[error(transparent)]
    Schedule(#[from] crate::schedule::ScheduleError),
    /// A file or directory the training loop could not create or write (`action` says which:
    /// "creating", "writing").
    #[error("{action} {}: {cause}", path.display())]
    Io {
        /// What was being done: "creating", "writing".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The system's error.
        cause: std::io::Error,
    },
    /// Another run (process `pid`, when known) is writing the output directory `dir`.
    #[error(
        "{} is in use by another training run{}; wait for it to end, or remove {} if no run is using it",
        dir.display(),
        pid.map_or(String::new(), |p| format!(" (process {p})")),
        dir.join(crate::dir_lock::LOCK_FILE).display()
    )]
    Locked {
        /// The output directory.
        dir: PathBuf,
        /// The process holding its lock.
        pid: Option<u32>,
    },
    /// Exporting the trained model or adapter to `path` failed.
    #[error("writing {}: {cause}", path.display())]
    Export {
        path: PathBuf,
        cause: Box<TrainError>,
    },
    /// A resumed checkpoint was written by a run with another identity
    /// (`LoopConfig::run_identity`).
    #[error(
        "--resume: {} was written by a run with other settings: {}",
        path.display(),
        settings_differences(checkpoint, run)
    )]
    ResumeMismatch {
        /// The checkpoint.
        path: PathBuf,
        /// The checkpoint's run identity (JSON).
        checkpoint: String,
        /// This run's identity (JSON).
        run: String,
    },
    /// Training stopped after `steps` non-finite steps in a row; `last_checkpoint` is the step
    /// of the newest checkpoint in the output directory, which is left intact.
    #[error("training stopped: {steps} non-finite steps in a row; {}", last_checkpoint_text(*last_checkpoint))]
    NonFinite {
        /// Non-finite steps in a row (`train_loop::MAX_BAD_STEPS`).
        steps: u32,
        /// The step of the newest checkpoint; `None` when there is none.
        last_checkpoint: Option<u64>,
    },
}

/// What differs between two run identities (JSON objects): `key: A in the checkpoint, B in
/// this run` for each key; both whole when they are not objects.
fn settings_differences(checkpoint: &str, run: &str) -> String {
    use serde_json::{Map, Value};
    let parse = |s: &str| match serde_json::from_str::<Value>(s) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    };
    let (Some(a), Some(b)) = (parse(checkpoint), parse(run)) else {
        return format!("{checkpoint} in the checkpoint; this run has {run}");
    };
    let show = |m: &Map<String, Value>, k: &str| m.get(k).map_or("unset".into(), Value::to_string);
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            let hint = match k.as_str() {
                "ranks" => " (a checkpoint resumes under mpirun with the ranks that wrote it)",
                _ => "",
            };
            format!(
                "{k} is {} in the checkpoint, {} in this run{hint}",
                show(&a, k),
                show(&b, k)
            )
        })
        .collect();
    match diffs.is_empty() {
        true => format!("{checkpoint} in the checkpoint; this run has {run}"),
        false => diffs.join("; "),
    }
}

fn last_checkpoint_text(step: Option<u64>) -> String {
    match step {
        Some(step) => format!("the last checkpoint (step {step}) is intact"),
        None => "no checkpoint was written".into(),
    }
}

pub type Result<T> = std::result::Result<T, TrainError>;

/// A backend's error as a [`TrainError`].
pub(crate) fn backend_err<E: std::error::Error + Send + Sync + 'static>(e: E) -> TrainError {
    TrainError::Backend(Box::new(e))
}
