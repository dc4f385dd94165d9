//! Writing trained weights back as a GGUF file that `tnn run` loads: the source file's metadata
//! (architecture, hyperparameters, tokenizer) with every tensor replaced by the trained f32
//! master copy, stored as F32 or F16.

use std::path::Path;

use tinynn_core::quant::quantize_row;
use tinynn_format::gguf::{GgufWriter, Value};
use tinynn_format::GgmlType;

use crate::error::{Result, TrainError};
use crate::trainer::Trainer;

/// `general.file_type` of an all-F32 / mostly-F16 file (llama.cpp's `LLAMA_FTYPE_*`).
fn file_type(ty: GgmlType) -> u32 {
    if ty == GgmlType::F16 {
        1
    } else {
        0
    }
}

impl Trainer {
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
        let mut tensors = self.params()?;
        tensors.extend(self.rope_freqs_tensor.clone());
        let mut encoded: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::new();
        for t in &tensors {
            // 1-D tensors (norms, biases, RoPE divisors) stay F32, as llama.cpp's converter does.
            let tt = if t.dims.len() == 1 { GgmlType::F32 } else { ty };
            let mut bytes = vec![0u8; t.data.len() * if tt == GgmlType::F16 { 2 } else { 4 }];
            quantize_row(tt, &t.data, &mut bytes).map_err(|e| TrainError::Param {
                name: t.name.clone(),
                message: e.to_string(),
            })?;
            let dims = t.dims.iter().map(|&d| d as u64).collect();
            encoded.push((t.name.clone(), tt, dims, bytes));
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
