//! Where a model's weights come from: a GGUF file, or a Hugging Face directory of safetensors.
//! Graphs ask for tensors by their GGUF names; HF names are mapped to them here (by the
//! architecture's `hf_name` in `crate::arch::REGISTRY`), and PyTorch shapes (outermost first)
//! become ggml dims (innermost first) — the bytes are the same.

use tinynn_format::gguf::GgufFile;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::HfModelDir;
use tinynn_format::safetensors::Dtype;
use tinynn_format::GgmlType;

use crate::{arch, ModelError, Result};

/// One weight: its type, ggml dims and bytes (borrowed from the file's memory map).
pub struct Weight<'a> {
    pub dtype: GgmlType,
    pub dims: Vec<u64>,
    pub data: &'a [u8],
}

#[derive(Clone, Copy)]
pub enum WeightSource<'a> {
    Gguf(&'a GgufFile),
    Hf(&'a HfModelDir),
}

impl<'a> From<&'a GgufFile> for WeightSource<'a> {
    fn from(f: &'a GgufFile) -> Self {
        WeightSource::Gguf(f)
    }
}

impl<'a> From<&'a HfModelDir> for WeightSource<'a> {
    fn from(d: &'a HfModelDir) -> Self {
        WeightSource::Hf(d)
    }
}

impl<'a> WeightSource<'a> {
    pub fn config(&self) -> Result<ModelConfig> {
        Ok(match self {
            WeightSource::Gguf(f) => ModelConfig::from_gguf(f.gguf())?,
            WeightSource::Hf(d) => ModelConfig::from_hf(&d.config)?,
        })
    }

    /// True for weights laid out as transformers stores them (q/k not permuted for RoPE).
    /// Releases the resident pages of a weight's bytes (after they were copied into a packed
    /// layout); they stay readable. Only GGUF files are released.
    pub fn release(&self, data: &[u8]) -> bool {
        match self {
            WeightSource::Gguf(f) => f.release(data),
            WeightSource::Hf(_) => false,
        }
    }

    pub fn is_hf(&self) -> bool {
        matches!(self, WeightSource::Hf(_))
    }

    /// The tensor with GGUF name `name`, if the model has it.
    pub fn get(&self, name: &str) -> Result<Option<Weight<'a>>> {
        match *self {
            WeightSource::Gguf(f) => Ok(f.tensor(name).map(|t| Weight {
                dtype: t.ggml_type(),
                dims: t.info.dims.clone(),
                data: t.data,
            })),
            WeightSource::Hf(d) => {
                let model_type = d.config.model_type.as_deref().unwrap_or("");
                let arch = arch::by_hf_model_type(model_type)
                    .ok_or_else(|| ModelError::UnsupportedArchitecture(model_type.to_string()))?;
                if let Some(plan) = arch.hf_rearranged.filter(|_| !d.is_rearranged()) {
                    // Made once, on first use (`Model::from_hf` asks at open).
                    let c = ModelConfig::from_hf(&d.config)?;
                    d.rearrange(|n| plan(n, &c))?;
                }
                if let Some(plan) = arch.hf_stacked {
                    // Made once, on first use.
                    if !d.is_stacked() {
                        d.stack(plan)?;
                    }
                    if let Some(s) = d.stacked(name) {
                        return Ok(Some(Weight {
                            dtype: dtype_of(name, s.dtype)?,
                            dims: s.shape.iter().rev().map(|&d| d as u64).collect(),
                            data: s.bytes,
                        }));
                    }
                }
                let Some(hf) = (arch.hf_name)(name) else {
                    return Ok(None);
                };
                // A checkpoint of the bare model (no LM head) names its tensors without the
                // `model.` / `transformer.` in front.
                let bare = hf
                    .strip_prefix("model.")
                    .or_else(|| hf.strip_prefix("transformer."));
                // Older GPT-NeoX checkpoints name the head embed_out, newer ones lm_head.
                let alias = (hf == "embed_out.weight").then_some("lm_head.weight");
                let Some((hf, (file, t))) = d
                    .tensor(&hf)
                    .map(|found| (hf.to_string(), found))
                    .or_else(|| bare.and_then(|b| Some((b.to_string(), d.tensor(b)?))))
                    .or_else(|| alias.and_then(|a| Some((a.to_string(), d.tensor(a)?))))
                else {
                    return Ok(None);
                };
                if let Some(r) = d.rearranged(&hf) {
                    // A transposed copy is [out, in], whose ggml dims are the file's; regrouped
                    // rows keep the file's shape.
                    let dims = if r.how == tinynn_format::model_dir::Rearrange::Transpose {
                        t.shape.iter().map(|&d| d as u64).collect()
                    } else {
                        t.shape.iter().rev().map(|&d| d as u64).collect()
                    };
                    return Ok(Some(Weight {
                        dtype: dtype_of(&hf, r.dtype)?,
                        dims,
                        data: r.bytes,
                    }));
                }
                let dims = t.shape.iter().rev().map(|&d| d as u64).collect();
                if let Some(data) = d.upcast(&hf) {
                    return Ok(Some(Weight {
                        dtype: GgmlType::F32,
                        dims,
                        data,
                    }));
                }
                Ok(Some(Weight {
                    dtype: dtype_of(&hf, t.dtype)?,
                    dims,
                    data: file.tensor_data(t),
                }))
            }
        }
    }
}

/// The ggml type of safetensors dtype `d` of tensor `hf`.
fn dtype_of(hf: &str, d: Dtype) -> Result<GgmlType> {
    match d {
        Dtype::F32 => Ok(GgmlType::F32),
        Dtype::F16 => Ok(GgmlType::F16),
        Dtype::BF16 => Ok(GgmlType::Bf16),
        other => Err(ModelError::Invalid(format!(
            "{hf}: {other:?} weights are not supported (F32, F16 and BF16 are: convert the checkpoint to one of them)"
        ))),
    }
}
