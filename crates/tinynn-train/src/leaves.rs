//! Training's [`Leaves`]: the tensors the trainer made before the graph (frozen base tensors
//! in their file types, F32 parameters), looked up by GGUF name, and trainable LoRA branches
//! with dropout on their input.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;
use tinynn_models::common::{Dropout, Init, Leaves, LoraBranch};
use tinynn_models::ModelError;

use crate::model::LoraGraph;

/// Looks parameters up by GGUF name.
pub struct ParamTable<'a> {
    pub names: &'a [String],
    pub ids: &'a [TensorId],
}

impl ParamTable<'_> {
    pub(crate) fn get(&self, name: &str) -> Option<TensorId> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| self.ids[i])
    }
}

/// The leaves of one training forward pass.
pub(crate) struct TrainLeaves<'a> {
    pub table: &'a ParamTable<'a>,
    /// Every projection whose `<w>.lora_a` / `<w>.lora_b` are in the table gets a branch.
    pub lora: Option<LoraGraph>,
    /// The dropout seed input, made with the first branch that needs it.
    pub seed: Option<TensorId>,
    /// Dropout sites so far (each one's salt).
    pub sites: u32,
}

impl TrainLeaves<'_> {
    fn need(&self, name: &str) -> tinynn_models::Result<TensorId> {
        self.table
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }
}

impl Leaves for TrainLeaves<'_> {
    /// The table's leaf `name`, whose dims must be `dims`.
    fn tensor(
        &mut self,
        g: &mut Graph,
        name: &str,
        dims: &[usize],
        _: Init,
    ) -> tinynn_models::Result<TensorId> {
        let t = self.need(name)?;
        let ne = g.layout(t).ne;
        let fits = dims.len() <= ne.len()
            && ne
                .iter()
                .enumerate()
                .all(|(i, &d)| d == dims.get(i).copied().unwrap_or(1));
        if !fits {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                got: ne.iter().map(|&d| d as u64).collect(),
                want: dims.iter().map(|&d| d as u64).collect(),
            });
        }
        Ok(t)
    }

    fn has(&self, name: &str) -> tinynn_models::Result<bool> {
        Ok(self.table.get(name).is_some())
    }

    /// `<name>.lora_a` / `.lora_b` from the table, with dropout (its own site) when asked.
    fn lora(&mut self, g: &mut Graph, name: &str) -> tinynn_models::Result<Option<LoraBranch>> {
        let Some(lora) = self.lora else {
            return Ok(None);
        };
        let Some(a) = self.table.get(&format!("{name}.lora_a")) else {
            return Ok(None);
        };
        let b = self.need(&format!("{name}.lora_b"))?;
        let dropout = if lora.dropout > 0.0 {
            let seed = match self.seed {
                Some(s) => s,
                None => *self
                    .seed
                    .insert(g.input("dropout_seed", GgmlType::I32, &[2])?),
            };
            self.sites += 1;
            Some(Dropout {
                seed,
                p: lora.dropout,
                site: self.sites,
            })
        } else {
            None
        };
        Ok(Some(LoraBranch {
            a,
            b,
            scale: lora.scale,
            dropout,
        }))
    }
}
