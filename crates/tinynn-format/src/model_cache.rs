//! Where model files are cached, and getting the default model (SmolLM2-135M-Instruct Q4_1)
//! into the cache with the project's fetch script.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

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

/// Where the default model lives in the cache (whether or not it is there yet).
pub fn default_model_path() -> Option<PathBuf> {
    cache_root().map(|root| root.join("models").join(DEFAULT_MODEL_FILE))
}

/// `scripts/fetch-models.sh` of the source tree this crate was built from.
pub fn fetch_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models.sh")
}

/// `path`, or when `None` the default model's ([`ensure_default_model`]).
pub fn model_or_default(path: Option<&std::path::Path>) -> Result<PathBuf> {
    path.map_or_else(ensure_default_model, |p| Ok(p.to_path_buf()))
}

/// The default model's path, running the fetch script first when it is not cached. The script
/// reports its progress on stderr.
pub fn ensure_default_model() -> Result<PathBuf> {
    let path = default_model_path().ok_or_else(|| {
        Error::invalid(
            "model cache",
            "no cache directory: set TINYNN_CACHE or HOME",
        )
    })?;
    if path.is_file() {
        return Ok(path);
    }
    let script = fetch_script();
    if !script.is_file() {
        return Err(Error::invalid(
            &path,
            format!(
                "the default model is not cached and the fetch script {} is missing",
                script.display()
            ),
        ));
    }
    eprintln!(
        "tinynn: {DEFAULT_MODEL_FILE} is not in the cache; fetching it with {}",
        script.display()
    );
    let status = Command::new("bash")
        .arg(&script)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| Error::io(&script, e))?;
    if !status.success() || !path.is_file() {
        return Err(Error::invalid(
            &path,
            format!("fetching the default model failed ({status})"),
        ));
    }
    Ok(path)
}
