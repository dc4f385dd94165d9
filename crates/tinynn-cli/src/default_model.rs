//! The default model (SmolLM2-135M-Instruct Q4_1): found in the cache, or fetched by the
//! project's fetch script.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The cache root: `$TINYNN_CACHE`, else `$XDG_CACHE_HOME/tinynn`, else `~/.cache/tinynn`
/// (the same rule as `scripts/fetch-models.sh`).
pub fn cache_root() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("TINYNN_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|p| p.join("tinynn")))
        .or_else(|| var("HOME").map(|p| p.join(".cache").join("tinynn")))
}

/// The path of the default model, fetching it first if it is not in the cache.
pub fn default_model() -> Result<PathBuf> {
    let root = cache_root().context("cannot find a cache directory: set TINYNN_CACHE or HOME")?;
    let path = root.join("models").join(DEFAULT_MODEL_FILE);
    if path.is_file() {
        return Ok(path);
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models.sh");
    if !script.is_file() {
        bail!(
            "the default model is not at {} and the fetch script {} is missing; pass a model with -m/FILE",
            path.display(),
            script.display()
        );
    }
    eprintln!(
        "tnn: default model not found in {}; fetching {DEFAULT_MODEL_FILE} with {}",
        root.display(),
        script.display()
    );
    let status = Command::new("bash")
        .arg(&script)
        .env("TINYNN_CACHE", &root)
        .stdout(std::process::Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}", script.display()))?;
    if !status.success() || !path.is_file() {
        bail!("fetching the default model failed ({status}); see the messages above");
    }
    Ok(path)
}
