//! LoRA adapters at inference, in llama.cpp's GGUF format: `general.type = adapter`,
//! `adapter.type = lora`, `adapter.lora.alpha` (f32), the base's `general.architecture`, and
//! per adapted tensor `W` the pair `<W>.lora_a` (ggml dims `[W.ne0, r]`) and `<W>.lora_b`
//! (`[r, W.ne1]`). A forward graph adds `scale·(alpha/r)·B·(A·x)` to `W·x` (`scale` only when
//! alpha is 0, as llama.cpp); the adapter's tensors are bound as weights from its file, which
//! the adapter owns (a session holds it through an `Arc`).

#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use tinynn_format::gguf::{GgufFile, Value};
use tinynn_format::GgmlType;

use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// One adapter tensor: its type, ggml dims and where its bytes lie in the adapter file.
#[derive(Clone, Debug)]
pub struct LoraTensor {
    /// F32 or F16.
    pub dtype: GgmlType,
    /// ggml dims.
    pub ne: [usize; 2],
    /// Byte range in the adapter file.
    pub range: Range<usize>,
}

/// The A/B pair of one base tensor.
#[derive(Clone, Debug)]
pub struct LoraPair {
    /// `lora_a`: ggml dims `[W.ne0, r]`.
    pub a: LoraTensor,
    /// `lora_b`: ggml dims `[r, W.ne1]`.
    pub b: LoraTensor,
}

impl LoraPair {
    /// The rank r.
    pub fn rank(&self) -> usize {
        self.a.ne[1]
    }
}

/// A loaded adapter; it owns its (memory-mapped) file.
pub struct LoraAdapter {
    file: GgufFile,
    /// The base model's `general.architecture`.
    pub architecture: String,
    /// `adapter.lora.alpha` (0: the scale alone).
    pub alpha: f32,
    /// Base tensor name → its A/B pair.
    pub pairs: BTreeMap<String, LoraPair>,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("path", &self.file.path())
            .field("architecture", &self.architecture)
            .field("alpha", &self.alpha)
            .field("pairs", &self.pairs.len())
            .finish()
    }
}

impl tinynn_core::backend::WeightStore for LoraAdapter {
    fn region(&self, i: usize) -> &[u8] {
        if i == 0 {
            self.file.bytes()
        } else {
            &[]
        }
    }
}

fn invalid(path: &std::path::Path, msg: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid(format!("LoRA adapter {}: {msg}", path.display()))
}

fn tensor(file: &GgufFile, name: &str) -> Result<LoraTensor> {
    let path = file.path();
    let t = file
        .tensor(name)
        .ok_or_else(|| invalid(path, format!("tensor '{name}' is missing")))?;
    let dtype = t.ggml_type();
    if !matches!(dtype, GgmlType::F32 | GgmlType::F16) {
        return Err(invalid(
            path,
            format!("tensor '{name}' is {dtype}; F32 and F16 adapters are supported"),
        ));
    }
    let dims = &t.info.dims;
    if dims.len() != 2 {
        return Err(invalid(
            path,
            format!("tensor '{name}' has dims {dims:?}, two are expected"),
        ));
    }
    let start = t.data.as_ptr() as usize - file.bytes().as_ptr() as usize;
    Ok(LoraTensor {
        dtype,
        ne: [dims[0] as usize, dims[1] as usize],
        range: start..start + t.data.len(),
    })
}

impl LoraAdapter {
    /// Opens and checks an adapter file.
    pub fn open(path: impl AsRef<Path>) -> Result<LoraAdapter> {
        LoraAdapter::from_gguf(GgufFile::open(path)?)
    }

    /// Reads and checks an adapter file (metadata, A/B pairs, ranks).
    pub fn from_gguf(file: GgufFile) -> Result<LoraAdapter> {
        let path = file.path();
        let g = file.gguf();
        let get_str = |k: &str| g.get_raw(k).and_then(Value::as_str);
        if get_str("general.type") != Some("adapter") {
            return Err(invalid(
                path,
                format!(
                    "general.type is {:?}, not \"adapter\"",
                    get_str("general.type")
                ),
            ));
        }
        if get_str("adapter.type") != Some("lora") {
            return Err(invalid(
                path,
                format!(
                    "adapter.type is {:?}, not \"lora\"",
                    get_str("adapter.type")
                ),
            ));
        }
        let architecture = get_str("general.architecture")
            .ok_or_else(|| invalid(path, "general.architecture is missing"))?
            .to_string();
        let alpha = match g.get_raw("adapter.lora.alpha") {
            Some(Value::F32(a)) if a.is_finite() => *a,
            None => 0.0,
            Some(other) => {
                return Err(invalid(
                    path,
                    format!("adapter.lora.alpha must be a finite f32, got {other:?}"),
                ))
            }
        };
        let mut pairs = BTreeMap::new();
        for t in file.gguf().tensors() {
            let name = t.name.as_str();
            let base = if let Some(b) = name.strip_suffix(".lora_a") {
                b
            } else if name.ends_with(".lora_b") {
                continue;
            } else {
                return Err(invalid(
                    path,
                    format!("tensor '{name}' is neither .lora_a nor .lora_b"),
                ));
            };
            let a = tensor(&file, name)?;
            let b = tensor(&file, &format!("{base}.lora_b"))?;
            if a.ne[1] != b.ne[0] || a.ne[1] == 0 {
                return Err(invalid(
                    path,
                    format!(
                        "'{base}': lora_a {:?} and lora_b {:?} do not share a rank",
                        a.ne, b.ne
                    ),
                ));
            }
            pairs.insert(base.to_string(), LoraPair { a, b });
        }
        for t in file.gguf().tensors() {
            if let Some(base) = t.name.strip_suffix(".lora_b") {
                if !pairs.contains_key(base) {
                    return Err(invalid(path, format!("'{}' has no lora_a", t.name)));
                }
            }
        }
        if pairs.is_empty() {
            return Err(invalid(path, "no adapter tensors"));
        }
        Ok(LoraAdapter {
            file,
            architecture,
            alpha,
            pairs,
        })
    }

    /// Checks the adapter against a base model: same architecture, every adapted tensor present
    /// with fitting dims.
    pub fn check_base(&self, src: &WeightSource<'_>) -> Result<()> {
        let base_arch = match src {
            WeightSource::Gguf(f) => f
                .gguf()
                .get_raw("general.architecture")
                .and_then(Value::as_str)
                .map(str::to_string),
            WeightSource::Hf(_) => None,
        }
        .map_or_else(
            || src.config().map(|c| c.architecture.name().to_string()),
            Ok,
        )?;
        if base_arch != self.architecture {
            return Err(ModelError::Invalid(format!(
                "the LoRA adapter is for architecture '{}', the model is '{base_arch}'",
                self.architecture
            )));
        }
        for (name, p) in &self.pairs {
            let w = src.get(name)?.ok_or_else(|| {
                ModelError::Invalid(format!(
                    "the LoRA adapter adapts '{name}', which the model does not have"
                ))
            })?;
            let fits = w.dims.len() == 2
                && w.dims[0] as usize == p.a.ne[0]
                && w.dims[1] as usize == p.b.ne[1];
            if !fits {
                return Err(ModelError::Invalid(format!(
                    "the LoRA adapter's '{name}' (A {:?}, B {:?}) does not fit the model's {:?}",
                    p.a.ne, p.b.ne, w.dims
                )));
            }
        }
        Ok(())
    }

    /// The factor of `B·A·x` at user scale `scale`: `scale·alpha/r`, or `scale` when alpha is 0.
    pub fn factor(&self, pair: &LoraPair, scale: f32) -> f32 {
        if self.alpha == 0.0 {
            scale
        } else {
            scale * self.alpha / pair.rank() as f32
        }
    }

    /// Where adapter tensor `name` (`<base>.lora_a` or `<base>.lora_b`) lies in the file.
    pub fn range(&self, name: &str) -> Option<Range<usize>> {
        if let Some(base) = name.strip_suffix(".lora_a") {
            return self.pairs.get(base).map(|p| p.a.range.clone());
        }
        let base = name.strip_suffix(".lora_b")?;
        self.pairs.get(base).map(|p| p.b.range.clone())
    }

    /// The bytes of adapter tensor `name` (`<base>.lora_a` or `<base>.lora_b`).
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        self.file.bytes().get(self.range(name)?)
    }

    /// The adapter's file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }
}

/// An adapter applied at a scale.
#[derive(Clone, Debug)]
pub struct AppliedLora {
    /// The adapter.
    pub adapter: Arc<LoraAdapter>,
    /// User scale (`--lora-scale`).
    pub scale: f32,
}

impl AppliedLora {
    /// `adapter` at user scale `scale`.
    pub fn new(adapter: LoraAdapter, scale: f32) -> AppliedLora {
        AppliedLora {
            adapter: Arc::new(adapter),
            scale,
        }
    }
}
