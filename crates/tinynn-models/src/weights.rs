//! Where a model's weights come from: a GGUF file, or a Hugging Face directory of safetensors.
//! Graphs ask for tensors by their GGUF names; HF names are mapped to them here, and PyTorch
//! shapes (outermost first) become ggml dims (innermost first) — the bytes are the same.

use std::borrow::Cow;

use tinynn_format::gguf::GgufFile;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::HfModelDir;
use tinynn_format::safetensors::Dtype;
use tinynn_format::GgmlType;

use crate::{ModelError, Result};

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

/// The HF (transformers Llama/Qwen2 layout) name of a GGUF tensor name.
fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(Cow::Borrowed(f));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (part, kind) = tail.rsplit_once('.')?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(Cow::Owned(format!("model.layers.{layer}.{hf}.{kind}")))
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
                let Some(hf) = hf_name(name) else {
                    return Ok(None);
                };
                let Some((file, t)) = d.tensor(&hf) else {
                    return Ok(None);
                };
                let dtype = match t.dtype {
                    Dtype::F32 => GgmlType::F32,
                    Dtype::F16 => GgmlType::F16,
                    Dtype::BF16 => GgmlType::Bf16,
                    other => {
                        return Err(ModelError::Invalid(format!(
                            "{hf}: {other:?} weights are not supported"
                        )))
                    }
                };
                Ok(Some(Weight {
                    dtype,
                    dims: t.shape.iter().rev().map(|&d| d as u64).collect(),
                    data: file.tensor_data(t),
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::hf_name;

    #[test]
    fn names_map_to_transformers_layout() {
        assert_eq!(
            hf_name("blk.3.attn_q.bias").as_deref(),
            Some("model.layers.3.self_attn.q_proj.bias")
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.weight").as_deref(),
            Some("model.layers.0.mlp.down_proj.weight")
        );
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.0.unknown.weight"), None);
    }
}
