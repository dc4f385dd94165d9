//! Inference's [`Leaves`]: the model file's tensors as read-only weight leaves of their file
//! types, and a LoRA adapter's A/B, each recorded with the name the session binds it by.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;

use crate::common::{Init, Leaves, LoraBranch};
use crate::lora::AppliedLora;
use crate::weights::WeightSource;
use crate::{ModelError, Result};

pub(crate) struct FileLeaves<'a> {
    pub src: WeightSource<'a>,
    pub lora: &'a [AppliedLora],
    /// Graph weights and the tensors that back them (`<W>.lora_a@i`/`.lora_b@i`: adapter i's,
    /// see [`adapter_tensor`]).
    pub weights: Vec<(TensorId, String)>,
}

impl Leaves for FileLeaves<'_> {
    /// A weight leaf for tensor `name` of the file, whose dims must be `dims` (ggml order).
    fn tensor(&mut self, g: &mut Graph, name: &str, dims: &[usize], _: Init) -> Result<TensorId> {
        let w = self
            .src
            .get(name)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        let want: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
        if w.dims != want {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                got: w.dims,
                want,
            });
        }
        let t = g.weight(name, w.dtype, dims)?;
        self.weights.push((t, name.to_string()));
        Ok(t)
    }

    fn has(&self, name: &str) -> Result<bool> {
        Ok(self.src.get(name)?.is_some())
    }

    /// The first adapter's branch (see [`FileLeaves::loras`]).
    fn lora(&mut self, g: &mut Graph, name: &str) -> Result<Option<LoraBranch>> {
        Ok(self.loras(g, name)?.into_iter().next())
    }

    /// Each adapter's `<name>.lora_a` / `.lora_b` (checked against the model by
    /// `LoraAdapter::check_base`) with its factor at its applied scale, in adapter order.
    fn loras(&mut self, g: &mut Graph, name: &str) -> Result<Vec<LoraBranch>> {
        let mut out = Vec::new();
        for (i, lora) in self.lora.iter().enumerate() {
            let Some(pair) = lora.adapter.pairs.get(name) else {
                continue;
            };
            let (a_name, b_name) = (format!("{name}.lora_a@{i}"), format!("{name}.lora_b@{i}"));
            let a = g.weight(&a_name, pair.a.dtype, &pair.a.ne)?;
            let b = g.weight(&b_name, pair.b.dtype, &pair.b.ne)?;
            self.weights.push((a, a_name));
            self.weights.push((b, b_name));
            out.push(LoraBranch {
                a,
                b,
                scale: lora.adapter.factor(pair, lora.scale),
                dropout: None,
            });
        }
        Ok(out)
    }
}

/// The adapter index and adapter tensor name (`<W>.lora_a` / `.lora_b`) of a graph weight
/// name [`FileLeaves`] gave an adapter tensor (`<W>.lora_a@i`), `None` for the model's own.
pub(crate) fn adapter_tensor(name: &str) -> Option<(usize, &str)> {
    let (tensor, i) = name.rsplit_once('@')?;
    let is_adapter = tensor.ends_with(".lora_a") || tensor.ends_with(".lora_b");
    is_adapter.then_some(())?;
    Some((i.parse().ok()?, tensor))
}
