//! Shared test helpers: where the real model is.

use std::path::PathBuf;
use std::process::Command;

/// The real SmolLM2-135M-Instruct Q4_1 file: `$TINYNN_MODEL`, else the cache, else fetched by
/// `scripts/fetch-models.sh` (which prints the path).
#[allow(dead_code)]
pub fn real_model() -> PathBuf {
    if let Some(p) = std::env::var_os("TINYNN_MODEL") {
        return PathBuf::from(p);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .expect("cannot run scripts/fetch-models.sh");
    assert!(
        out.status.success(),
        "scripts/fetch-models.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}
