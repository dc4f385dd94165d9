//! Where model files are cached, and getting the models the project knows — the default model
//! (SmolLM2-135M-Instruct Q4_1) and Gemma 3 270M (Q4_K_M) — into the cache with the project's
//! fetch script.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A model `scripts/fetch-models.sh` knows how to fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownModel {
    /// SmolLM2-135M-Instruct, GGUF Q4_1: the default model.
    SmolLm2,
    /// Gemma 3 270M (base), GGUF Q4_K_M.
    Gemma3,
}

impl KnownModel {
    /// The script's name for it.
    pub fn name(self) -> &'static str {
        match self {
            KnownModel::SmolLm2 => "smollm2",
            KnownModel::Gemma3 => "gemma3",
        }
    }

    /// Its file name in the cache.
    pub fn file_name(self) -> &'static str {
        match self {
            KnownModel::SmolLm2 => DEFAULT_MODEL_FILE,
            KnownModel::Gemma3 => "gemma-3-270m-Q4_K_M.gguf",
        }
    }
}

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
    model_path(KnownModel::SmolLm2)
}

/// Where model `m` lives in the cache (whether or not it is there yet).
pub fn model_path(m: KnownModel) -> Option<PathBuf> {
    cache_root().map(|root| root.join("models").join(m.file_name()))
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
    ensure_model(KnownModel::SmolLm2)
}

/// Model `m`'s path, running the fetch script first when it is not cached. The script reports
/// its progress on stderr.
pub fn ensure_model(m: KnownModel) -> Result<PathBuf> {
    let file = m.file_name();
    let path = model_path(m).ok_or_else(|| {
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
                "{file} is not cached and the fetch script {} is missing",
                script.display()
            ),
        ));
    }
    eprintln!(
        "tinynn: {file} is not in the cache; fetching it with {}",
        script.display()
    );
    let status = Command::new("bash")
        .arg(&script)
        .arg(m.name())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| Error::io(&script, e))?;
    if !status.success() || !path.is_file() {
        return Err(Error::invalid(
            &path,
            format!("fetching {file} failed ({status})"),
        ));
    }
    Ok(path)
}
