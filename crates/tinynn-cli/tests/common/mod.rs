//! Running `tnn` as a user would, measuring what the process used.

pub mod ffi_wait4;

use std::path::PathBuf;
use std::process::Command;

pub use ffi_wait4::run_measured;

pub fn tnn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tnn"))
}

/// The real SmolLM2 file, fetched into the cache first if needed.
pub fn real_model() -> PathBuf {
    tinynn_format::model_cache::ensure_default_model().expect("the default model")
}
