//! Running `tnn` as a user would, measuring what the process used.

pub mod ffi_wait4;

use std::path::PathBuf;
use std::process::Command;

pub use ffi_wait4::run_measured;

pub fn tnn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tnn"))
}

/// The real SmolLM2 file, fetched into the cache first (`tnn pull`) if needed.
pub fn real_model() -> PathBuf {
    if let Ok(p) = tinynn_format::model_cache::require_default_model() {
        return p;
    }
    let out = tnn().arg("pull").output().expect("running tnn pull");
    assert!(
        out.status.success(),
        "tnn pull: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    tinynn_format::model_cache::require_default_model().expect("the default model")
}
