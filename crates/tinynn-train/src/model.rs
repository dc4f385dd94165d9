//! The training forward pass: `batch` sequences of `seq` tokens at once, no KV cache, each
//! sequence attending causally to itself only, ending in the mean cross-entropy.
//!
//! The decoder is the model's architecture (`tinynn_models::arch`), the same code the
//! inference graph runs: here its tensors come from [`ParamTable`] (persistent F32 parameters
//! the optimizer updates in place, or frozen base tensors in their file types) through
//! `crate::leaves`, and attention runs in full-sequence mode, the sequences as flash
//! attention's batch dimension. What is training's own is here: the inputs (labels, the loss
//! normalizer, the dropout seed), and the output head scored and differentiated in chunks.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;
use tinynn_models::arch::{self, trunk, Arch, Hparams};
use tinynn_models::common::{Attention, AttnMode, RopeInputs};

use crate::error::{Result, TrainError};
pub use crate::leaves::ParamTable;
use crate::leaves::TrainLeaves;

/// The batch shape of one forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    pub batch: usize,
    pub seq: usize,
}

impl BatchShape {
    pub fn n_tokens(&self) -> usize {
        self.batch * self.seq
    }
}

/// The inputs and outputs of a training forward pass.
pub struct TrainForward {
    /// I32 `[batch·seq]`: token ids, sequence after sequence.
    pub tokens: TensorId,
    /// I32 `[batch·seq]`: the token to predict at each position; negative = not scored.
    pub labels: TensorId,
    /// I32 `[batch·seq]`: position within its sequence (`t mod seq`), written once.
    pub pos: TensorId,
    /// F32 `[seq, seq]`: 0 where query i may see key j (j ≤ i), -inf elsewhere; written once.
    pub mask: Option<TensorId>,
    /// F32 `[seq, seq]`: the sliding-window layers' mask (j ≤ i < j + window), when the model
    /// has such layers; written once. (Each mask exists only when some layer reads it: an
    /// input no step reads is not planned.)
    pub mask_swa: Option<TensorId>,
    /// F32 `[n_dims/2]` RoPE frequency divisors (Llama 3 scaling), written once.
    pub freqs: Option<TensorId>,
    /// F32 `[1]`: how many positions are scored (labels in `0..n_vocab`), written with the
    /// labels (see [`scored`]); the loss of each chunk of the head is divided by it.
    pub loss_norm: TensorId,
    /// F32 `[1]`: mean cross-entropy over the scored positions.
    pub loss: TensorId,
    /// With [`HeadBackward`]: the head's part of the backward, done chunk by chunk.
    pub head_grads: Option<HeadGrads>,
    /// I32 `[2]`: the seed of the LoRA branches' dropout masks (`Graph::dropout`, one salt
    /// per adapted projection), written before every run; `None` without dropout.
    pub dropout_seed: Option<TensorId>,
}

/// Tokens per chunk of a frozen output head `[n_embd, n_vocab]` of `head_bytes`: logits are
/// made, scored and differentiated a chunk at a time, so only one chunk's logits and their
/// gradient are ever live. A chunk's logits take at most what the head's weights take, in
/// whole blocks of the f32 GEMM (256 tokens) or else of 64 tokens (at least 64): a quantized
/// head (QLoRA) gets small chunks and little memory (SmolLM2's Q8_0 head: 128 tokens,
/// 2 × 25 MB instead of 2 × 201 MB for 1024 tokens), an F32 head larger ones that keep its
/// products efficient (512 tokens: its two products take 332 ms a step; 457 ms in chunks of
/// 128, 433 ms in chunks of 576 and 448).
pub fn head_chunk(head_bytes: usize, n_vocab: usize) -> usize {
    let tokens = head_bytes / (4 * n_vocab.max(1));
    if tokens >= 256 {
        tokens / 256 * 256
    } else {
        (tokens / 64 * 64).max(64)
    }
}

/// Ask [`build_forward`] to differentiate the head as it goes (the grad pass).
#[derive(Clone, Copy, Debug)]
pub struct HeadBackward<'a> {
    /// The loss gradient (`1/accum`).
    pub seed: f32,
    /// The trainable tensors: when the head weight is one of them its gradient is made too.
    pub params: &'a [TensorId],
}

/// The head's gradients: the rest of the backward starts from them
/// (`Graph::backward_from`).
#[derive(Clone, Copy, Debug)]
pub struct HeadGrads {
    /// F32 `[n_embd, batch·seq]`: the normalized hidden states the head reads.
    pub hidden: TensorId,
    /// Their gradient.
    pub d_hidden: TensorId,
    /// The head weight (the embedding table when tied).
    pub head: TensorId,
    /// Its gradient from the head, when it is trainable.
    pub d_head: Option<TensorId>,
}

/// How many labels are scored (`0 ≤ label < n_vocab`): `TrainForward::loss_norm`'s value.
pub fn scored(labels: &[i32], n_vocab: usize) -> f32 {
    labels
        .iter()
        .filter(|&&l| l >= 0 && (l as usize) < n_vocab)
        .count() as f32
}

/// The LoRA branches of a forward pass: every projection whose `<w>.lora_a` / `<w>.lora_b` are
/// in the parameter table gets `+ scale·B·(A·(mask ⊙ x))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraGraph {
    /// `alpha / rank`.
    pub scale: f32,
    /// Dropout probability on each branch's input (training); 0: none.
    pub dropout: f32,
}

/// The causal mask of one sequence (`TrainForward::mask`'s values); with a `window`, keys
/// `window` or more positions back are hidden too (`TrainForward::mask_swa`'s).
pub fn causal_mask(seq: usize, window: Option<usize>) -> Vec<f32> {
    (0..seq * seq)
        .map(|i| {
            let (query, key) = (i / seq, i % seq);
            let hidden = key > query || window.is_some_and(|w| query - key >= w);
            if hidden {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect()
}

/// Positions of a batch (`TrainForward::pos`'s values).
pub fn positions(shape: BatchShape) -> Vec<i32> {
    (0..shape.n_tokens())
        .map(|t| (t % shape.seq) as i32)
        .collect()
}

/// Builds the forward pass of `arch`'s decoder and the loss into `g` over the tensors in `p`
/// (created by the caller as persistent leaves with GGUF names and dims: F32 parameters, and
/// frozen base tensors of any type), with the LoRA branches `lora` describes. With
/// `head_backward`, the head's gradients are built chunk by chunk right after each chunk's
/// loss ([`TrainForward::head_grads`]).
pub fn build_forward(
    g: &mut Graph,
    arch: &Arch,
    hp: &Hparams,
    p: &ParamTable<'_>,
    shape: BatchShape,
    lora: Option<LoraGraph>,
    head_backward: Option<HeadBackward<'_>>,
) -> Result<TrainForward> {
    const I32: GgmlType = GgmlType::I32;
    let (s, n) = (shape.seq, shape.n_tokens());
    if n == 0 {
        return Err(TrainError::Invalid("the batch holds no tokens".into()));
    }
    let tokens = g.input("tokens", I32, &[n])?;
    let labels = g.input("labels", I32, &[n])?;
    let loss_norm = g.input("loss_norm", GgmlType::F32, &[1])?;
    let pos = g.input("pos", I32, &[n])?;
    let mask = match hp.has_global_layers() && hp.ssm.is_none() {
        true => Some(g.input("mask", GgmlType::F32, &[s, s])?),
        false => None,
    };
    let mask_swa = match hp.swa {
        Some(_) => Some(g.input("mask_swa", GgmlType::F32, &[s, s])?),
        None => None,
    };
    let freqs = match &hp.freq_factors {
        Some(f) => Some(g.input("rope_freqs", GgmlType::F32, &[f.len()])?),
        None => None,
    };
    let mut lv = TrainLeaves {
        table: p,
        lora,
        seed: None,
        sites: 0,
    };
    let mut at = Attention {
        n_tokens: n,
        rope: RopeInputs { pos, freqs },
        mode: AttnMode::Full {
            batch: shape.batch,
            seq: s,
            mask,
            mask_swa,
        },
    };
    let dec = arch.decoder;
    let t = trunk(dec, g, &mut lv, hp, &mut at, tokens)?; // x: [e, n]
    let h = dec.output_norm(g, &mut lv, hp, t.x)?; // [e, n]

    // Tied embeddings: the head is the embedding table, which then gets both gradients.
    let head = dec.head(g, &mut lv, hp, t.table)?; // [e, n_vocab]
    let e = g.layout(h).ne[0];
    let head_trainable = head_backward.is_some_and(|b| b.params.contains(&head));
    let (mut loss, mut d_hidden, mut d_head) = (None, None, None);
    // A trainable head takes the batch whole: in chunks its gradient would be a sum of full
    // [n_embd, n_vocab] partial products, one per chunk (8 × 113 MB for SmolLM2), and full
    // fine-tuning's optimizer state dwarfs the logits it would save.
    let chunk = if head_trainable {
        n
    } else {
        let lh = g.layout(head);
        head_chunk(lh.contiguous_bytes(), lh.ne[1])
    };
    for c0 in (0..n).step_by(chunk) {
        let len = chunk.min(n - c0);
        let hc = g.view(h, &[e, len], &[e * 4], c0 * e * 4)?; // [e, len]
        let lc = g.view(labels, &[len], &[], c0 * 4)?;
        let logits = arch::logits(g, hp, head, hc)?; // [n_vocab, len]
        let lossc = g.cross_entropy_loss_normalized(logits, lc, loss_norm)?;
        loss = Some(match loss {
            Some(l) => g.add(l, lossc)?,
            None => lossc,
        });
        let Some(hb) = head_backward else { continue };
        let wrt: &[TensorId] = if head_trainable { &[hc, head] } else { &[hc] };
        let grads = g.backward_to(lossc, wrt, hb.seed)?;
        let dhc = grads[0].ok_or_else(|| TrainError::Invalid("the head does not read h".into()))?;
        d_hidden = Some(match d_hidden {
            Some(d) => g.concat(d, dhc, 1)?,
            None => dhc,
        });
        if let Some(dw) = grads.get(1).copied().flatten() {
            d_head = Some(match d_head {
                Some(d) => g.add(d, dw)?,
                None => dw,
            });
        }
    }
    let loss = loss.ok_or_else(|| TrainError::Invalid("the batch holds no tokens".into()))?;
    g.set_name(loss, "loss")?;
    g.set_output(loss)?;
    let head_grads = d_hidden.map(|d_hidden| HeadGrads {
        hidden: h,
        d_hidden,
        head,
        d_head,
    });
    Ok(TrainForward {
        tokens,
        labels,
        pos,
        mask,
        mask_swa,
        freqs,
        loss_norm,
        loss,
        head_grads,
        dropout_seed: lv.seed,
    })
}

#[cfg(test)]
mod tests {
    use super::head_chunk;

    #[test]
    fn head_chunks_take_at_most_the_heads_bytes() {
        // SmolLM2's head [576, 49152]: F32, Q8_0 (34 B per 32 values), Q4_1 (20 B per 32).
        assert_eq!(head_chunk(576 * 49152 * 4, 49152), 512);
        assert_eq!(head_chunk(576 / 32 * 34 * 49152, 49152), 128);
        assert_eq!(head_chunk(576 / 32 * 20 * 49152, 49152), 64);
        assert_eq!(head_chunk(0, 0), 64);
    }
}
