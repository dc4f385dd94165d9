//! Writing trained weights back as a GGUF file that `tnn run` loads: the source file's metadata
//! (architecture, hyperparameters, tokenizer) with every tensor replaced by the trained f32
//! master copy, stored as F32 or F16. A LoRA trainer writes the merged model
//! (`W' = W + (alpha/r)·B·A` for adapted tensors, stored as F32 or F16; the other base tensors
//! keep their file types and bytes) or the adapter alone (llama.cpp's GGUF LoRA format).

use std::path::Path;

use tinynn_core::backend::Backend;
use tinynn_core::quant::{dequantize_row, quantize_row};
use tinynn_format::gguf::{GgufWriter, Value};
use tinynn_format::GgmlType;

use crate::error::{Result, TrainError};
use crate::lora::{adapter_names, merge_into, write_adapter};
use crate::trainer::Trainer;

/// One tensor to write: name, type, dims, bytes.
type Encoded = (String, GgmlType, Vec<u64>, Vec<u8>);

fn encode(name: &str, dims: &[usize], data: &[f32], ty: GgmlType) -> Result<Encoded> {
    // 1-D tensors (norms, biases, RoPE divisors) stay F32, as llama.cpp's converter does.
    let tt = if dims.len() == 1 { GgmlType::F32 } else { ty };
    let mut bytes = vec![0u8; data.len() * if tt == GgmlType::F16 { 2 } else { 4 }];
    quantize_row(tt, data, &mut bytes).map_err(|e| TrainError::Param {
        name: name.into(),
        message: e.to_string(),
    })?;
    Ok((
        name.into(),
        tt,
        dims.iter().map(|&d| d as u64).collect(),
        bytes,
    ))
}

/// `general.file_type` of an all-F32 / mostly-F16 file (llama.cpp's `LLAMA_FTYPE_*`).
fn file_type(ty: GgmlType) -> u32 {
    if ty == GgmlType::F16 {
        1
    } else {
        0
    }
}

impl<B: Backend> Trainer<B> {
    /// Whether [`Trainer::export_gguf`] can write a model: the trainer has a GGUF file's
    /// metadata to copy (it was loaded from one, or it was given with
    /// [`Trainer::set_export_metadata`]).
    pub fn can_export_gguf(&self) -> bool {
        self.gguf_metadata.is_some()
    }

    /// Writes the current weights to `path` (atomically) as `ty` (F32 or F16) tensors, with the
    /// metadata of the GGUF file the trainer was loaded from.
    pub fn export_gguf(&self, path: &Path, ty: GgmlType) -> Result<u64> {
        if !matches!(ty, GgmlType::F32 | GgmlType::F16) {
            return Err(TrainError::Unsupported(format!("exporting {ty} tensors")));
        }
        let Some(metadata) = &self.gguf_metadata else {
            return Err(TrainError::Unsupported(
                "exporting a model that was not loaded from a GGUF file (no metadata or tokenizer to copy)"
                    .into(),
            ));
        };
        let mut encoded = if self.lora().is_some() {
            self.merged(ty)?
        } else {
            // Encoded from where the values live (no f32 copy of the model).
            self.param_views()?
                .into_iter()
                .map(|(name, dims, data)| encode(name, dims, data, ty))
                .collect::<Result<Vec<_>>>()?
        };
        for t in &self.rope_tensors {
            encoded.push(encode(&t.name, &t.dims, &t.data, ty)?);
        }
        let mut w = GgufWriter::new();
        for (k, v) in metadata {
            w.set(k, v.clone());
        }
        w.set("general.file_type", Value::U32(file_type(ty)));
        for (name, tt, dims, bytes) in &encoded {
            w.add_tensor(name, *tt, dims, bytes)?;
        }
        Ok(w.write_atomic(path)?)
    }
}

impl<B: Backend> Trainer<B> {
    /// The base tensors with the adapter merged into the adapted ones (as `ty`); the others as
    /// they are.
    fn merged(&self, ty: GgmlType) -> Result<Vec<Encoded>> {
        let Some(lora) = self.lora() else {
            return Err(TrainError::Invalid("merging needs a LoRA trainer".into()));
        };
        let params = self.params()?;
        let find = |name: &str| params.iter().find(|p| p.name == name);
        let mut out = Vec::with_capacity(self.frozen.len());
        for f in &self.frozen {
            let bytes = self.frozen_bytes(&f.name)?;
            let (a_name, b_name) = adapter_names(&f.name);
            let (Some(a), Some(b)) = (find(&a_name), find(&b_name)) else {
                let dims = f.dims.iter().map(|&d| d as u64).collect();
                out.push((f.name.clone(), f.dtype, dims, bytes.to_vec()));
                continue;
            };
            let mut w = vec![0f32; f.dims.iter().product()];
            dequantize_row(f.dtype, &bytes, &mut w).map_err(|e| TrainError::Dequantize {
                name: f.name.clone(),
                message: e.to_string(),
            })?;
            merge_into(&mut w, f.dims[0], &a.data, &b.data, lora.rank, lora.scale());
            out.push(encode(&f.name, &f.dims, &w, ty)?);
        }
        Ok(out)
    }

    /// Writes the trained LoRA adapter to `path` in llama.cpp's GGUF LoRA format (F32 tensors).
    pub fn export_adapter(&self, path: &Path) -> Result<u64> {
        let Some(lora) = self.lora() else {
            return Err(TrainError::Invalid(
                "exporting an adapter needs a LoRA trainer".into(),
            ));
        };
        write_adapter(path, &self.architecture(), lora, &self.params()?)
    }
}
