//! Running `tnn` as a user would, measuring what the process used.

pub mod ffi_wait4;

use std::path::{Path, PathBuf};
use std::process::Command;

pub use ffi_wait4::run_measured;

pub fn tnn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tnn"))
}

/// The real SmolLM2 file (`$TINYNN_MODEL`, the cache, or fetched by scripts/fetch-models.sh).
pub fn real_model() -> PathBuf {
    if let Some(p) = std::env::var_os("TINYNN_MODEL") {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("cannot run scripts/fetch-models.sh");
    assert!(
        out.status.success(),
        "fetch-models.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
