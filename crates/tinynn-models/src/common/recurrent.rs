//! A recurrent layer's state (Mamba's convolution inputs and scan state), read at the start of
//! a run and written back at its end, in the two modes of [`Attention`]:
//!
//! - **Cache** (inference): each layer keeps persistent F32 tables with one column per
//!   sequence slot of the session, `state_conv.{l}` `[(d_conv − 1)·d_inner, n_slots]` and
//!   `state_ssm.{l}` `[d_state·d_inner, n_slots]`; a run gathers the columns of its sequences
//!   (`slots`), zeroes those that start fresh (`keep`), and writes the new states back with
//!   `set_rows`.
//! - **Full** (training): every sequence starts from zeros and nothing is kept.
//!
//! A run's tokens form a grid of `n_seqs` sequences of `n_t` tokens each, sequence after
//! sequence (token t of sequence s at `s·n_t + t`), as the scan reads them.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use super::attention::{Attention, AttnMode};
use crate::{ModelError, Result};

/// The run-time inputs of a recurrent inference graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateInputs {
    /// Sequence slots the session holds (columns of every state table).
    pub n_slots: usize,
    /// Sequences in this run (the grid's second dimension).
    pub n_seqs: usize,
    /// I32 `[n_seqs]`: the slot of each sequence of the run.
    pub slots: TensorId,
    /// F32 `[1, n_seqs]`: 1 where a sequence continues from its slot's state, 0 where it
    /// starts fresh.
    pub keep: TensorId,
}

/// The sizes of one layer's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateDims {
    pub d_conv: usize,
    pub d_inner: usize,
    pub d_state: usize,
}

/// One layer's state at the start of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerState {
    /// F32 `[d_conv − 1, d_inner, n_seqs]`: the convolution's last inputs.
    pub conv: TensorId,
    /// F32 `[d_state, d_inner, n_seqs]`: the scan's state.
    pub ssm: TensorId,
    /// Tokens per sequence.
    pub n_t: usize,
    /// Sequences.
    pub n_seqs: usize,
}

impl Attention<'_> {
    /// The grid of this run: (tokens per sequence, sequences).
    pub fn recurrent_grid(&self) -> Result<(usize, usize)> {
        let n = self.n_tokens;
        let n_seqs = match &self.mode {
            AttnMode::Cache(kv) => kv.states.map(|s| s.n_seqs).ok_or_else(|| {
                ModelError::Invalid("a recurrent layer in a graph without state inputs".into())
            })?,
            AttnMode::Full { batch, .. } => *batch,
        };
        if n_seqs == 0 || !n.is_multiple_of(n_seqs) {
            return Err(ModelError::Invalid(format!(
                "{n} tokens are not {n_seqs} sequences of equal length"
            )));
        }
        Ok((n / n_seqs, n_seqs))
    }

    /// Layer `layer`'s state at the start of the run (see the module docs).
    pub fn load_state(&mut self, g: &mut Graph, layer: usize, d: StateDims) -> Result<LayerState> {
        let (n_t, n_s) = self.recurrent_grid()?;
        let conv_ne = [d.d_conv - 1, d.d_inner, n_s];
        let ssm_ne = [d.d_state, d.d_inner, n_s];
        let (conv, ssm) = match &mut self.mode {
            AttnMode::Cache(kv) => {
                let st = kv.states.ok_or_else(|| {
                    ModelError::Invalid("a recurrent layer in a graph without state inputs".into())
                })?;
                let conv_all = g.persistent(
                    &format!("state_conv.{layer}"),
                    GgmlType::F32,
                    &[(d.d_conv - 1) * d.d_inner, st.n_slots],
                )?;
                let ssm_all = g.persistent(
                    &format!("state_ssm.{layer}"),
                    GgmlType::F32,
                    &[d.d_state * d.d_inner, st.n_slots],
                )?;
                kv.caches.extend([conv_all, ssm_all]);
                let gather = |g: &mut Graph, all: TensorId, ne: &[usize]| -> Result<TensorId> {
                    let cols = g.get_rows(all, st.slots)?; // [X, n_s]
                    let kept = g.mul(cols, st.keep)?; // fresh sequences start from zeros
                    Ok(g.reshape(kept, ne)?)
                };
                (gather(g, conv_all, &conv_ne)?, gather(g, ssm_all, &ssm_ne)?)
            }
            AttnMode::Full { .. } => (g.fill(&conv_ne, 0.0)?, g.fill(&ssm_ne, 0.0)?),
        };
        Ok(LayerState {
            conv,
            ssm,
            n_t,
            n_seqs: n_s,
        })
    }

    /// Writes layer `layer`'s state at the end of the run (inference; training keeps none):
    /// `conv` `[d_conv − 1, d_inner, n_seqs]` and `ssm` `[d_state, d_inner, n_seqs]`, both
    /// contiguous.
    pub fn store_state(
        &mut self,
        g: &mut Graph,
        layer: usize,
        conv: TensorId,
        ssm: TensorId,
    ) -> Result<()> {
        let AttnMode::Cache(kv) = &mut self.mode else {
            return Ok(());
        };
        let st = kv.states.ok_or_else(|| {
            ModelError::Invalid("a recurrent layer in a graph without state inputs".into())
        })?;
        // The tables were made by `load_state`: the last two caches of this layer.
        let n = kv.caches.len();
        if n < 2 {
            return Err(ModelError::Invalid(format!(
                "layer {layer} stores a state it never loaded"
            )));
        }
        for (table, new) in [(kv.caches[n - 2], conv), (kv.caches[n - 1], ssm)] {
            let ne = g.layout(new).ne;
            let rows = ne[0] * ne[1];
            let cols = g.reshape(new, &[rows, st.n_seqs])?; // [X, n_s]
            g.set_rows(table, cols, st.slots)?;
        }
        Ok(())
    }
}
