//! The Llama-family forward pass for training: `batch` sequences of `seq` tokens at once, no KV
//! cache, each sequence attending causally to itself only, ending in the mean cross-entropy.
//!
//! It reads the same hyperparameters as the inference graph (`tinynn_models::llama`'s
//! `LlamaHparams`: RoPE mode and scaling, GQA, q/k norms, biases, tied head) and the same GGUF
//! tensor names, but is its own builder: inference binds read-only weights of any type and
//! attends through the head-major KV cache, while here every parameter is a persistent F32
//! leaf (the master copy the optimizer updates in place) and attention runs per sequence over
//! that sequence's own keys.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;
use tinynn_models::llama::LlamaHparams;

use crate::error::{Result, TrainError};

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
    pub mask: TensorId,
    /// F32 `[n_dims/2]` RoPE frequency divisors (Llama 3 scaling), written once.
    pub freqs: Option<TensorId>,
    /// F32 `[n_vocab, batch·seq]`.
    pub logits: TensorId,
    /// F32 `[1]`: mean cross-entropy over the scored positions.
    pub loss: TensorId,
    /// F32 dropout masks of the LoRA branches (`[in, batch·seq]` each, one per adapted
    /// projection), written before every run; empty without dropout.
    pub dropout_masks: Vec<TensorId>,
}

/// The LoRA branches of a forward pass: every projection whose `<w>.lora_a` / `<w>.lora_b` are
/// in the parameter table gets `+ scale·B·(A·(mask ⊙ x))`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraGraph {
    /// `alpha / rank`.
    pub scale: f32,
    /// Multiply each branch's input by a per-run mask (training with dropout).
    pub dropout: bool,
}

/// What the projections of one forward pass add (LoRA branches) and collect (their masks).
struct Adapters {
    lora: Option<LoraGraph>,
    masks: Vec<TensorId>,
}

/// Looks parameters up by GGUF name.
pub struct ParamTable<'a> {
    pub names: &'a [String],
    pub ids: &'a [TensorId],
}

impl ParamTable<'_> {
    fn get(&self, name: &str) -> Option<TensorId> {
        self.names
            .iter()
            .position(|n| n == name)
            .map(|i| self.ids[i])
    }

    fn need(&self, name: &str) -> Result<TensorId> {
        self.get(name).ok_or_else(|| TrainError::Param {
            name: name.into(),
            message: "the training graph needs it but it is not a parameter".into(),
        })
    }
}

/// The causal mask of one sequence (`TrainForward::mask`'s values).
pub fn causal_mask(seq: usize) -> Vec<f32> {
    (0..seq * seq)
        .map(|i| {
            if i % seq > i / seq {
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

/// `rms_norm(x) * w`.
fn norm(g: &mut Graph, x: TensorId, w: TensorId, eps: f32) -> Result<TensorId> {
    let h = g.rms_norm(x, eps)?;
    Ok(g.mul(h, w)?)
}

/// `w·x`, plus the LoRA branch of `w` when it has one.
fn project(
    g: &mut Graph,
    p: &ParamTable<'_>,
    ad: &mut Adapters,
    x: TensorId,
    w: &str,
) -> Result<TensorId> {
    let y = g.mul_mat(p.need(w)?, x)?;
    let Some(lora) = ad.lora else {
        return Ok(y);
    };
    let Some(a) = p.get(&format!("{w}.lora_a")) else {
        return Ok(y);
    };
    let b = p.need(&format!("{w}.lora_b"))?;
    let xin = if lora.dropout {
        let ne = g.layout(x).ne;
        let mask = g.input(&format!("dropout.{w}"), GgmlType::F32, &ne[..2])?;
        ad.masks.push(mask);
        g.mul(x, mask)?
    } else {
        x
    };
    let ax = g.mul_mat(a, xin)?; // [r, n]
    let bax = g.mul_mat(b, ax)?; // [out, n]
    let branch = g.scale(bax, lora.scale)?;
    Ok(g.add(y, branch)?)
}

/// `w·x (+ bias)` (with `w`'s LoRA branch).
fn linear(
    g: &mut Graph,
    p: &ParamTable<'_>,
    ad: &mut Adapters,
    x: TensorId,
    w: &str,
    b: &str,
) -> Result<TensorId> {
    let y = project(g, p, ad, x, w)?;
    Ok(match p.get(b) {
        Some(b) => g.add(y, b)?,
        None => y,
    })
}

/// Builds the forward pass and the loss into `g` over the tensors in `p` (created by the
/// caller as persistent leaves with GGUF names and dims: F32 parameters, and frozen base
/// tensors of any type), with the LoRA branches `lora` describes.
pub fn build_forward(
    g: &mut Graph,
    hp: &LlamaHparams,
    p: &ParamTable<'_>,
    shape: BatchShape,
    lora: Option<LoraGraph>,
) -> Result<TrainForward> {
    let mut ad = Adapters {
        lora,
        masks: Vec::new(),
    };
    const I32: GgmlType = GgmlType::I32;
    let (hd, nh, nkv) = (hp.head_dim, hp.n_head, hp.n_head_kv);
    let (s, n) = (shape.seq, shape.n_tokens());
    if n == 0 {
        return Err(TrainError::Invalid("the batch holds no tokens".into()));
    }
    let tokens = g.input("tokens", I32, &[n])?;
    let labels = g.input("labels", I32, &[n])?;
    let pos = g.input("pos", I32, &[n])?;
    let mask = g.input("mask", GgmlType::F32, &[s, s])?;
    let freqs = match &hp.freq_factors {
        Some(f) => Some(g.input("rope_freqs", GgmlType::F32, &[f.len()])?),
        None => None,
    };
    let tok_embd = p.need("token_embd.weight")?;
    let mut x = g.get_rows(tok_embd, tokens)?; // [e, n]
    let scale = 1.0 / (hd as f32).sqrt();
    for l in 0..hp.n_layer {
        let name = |s: &str| format!("blk.{l}.{s}");
        // Attention.
        let h = norm(g, x, p.need(&name("attn_norm.weight"))?, hp.norm_eps)?;
        let q = linear(
            g,
            p,
            &mut ad,
            h,
            &name("attn_q.weight"),
            &name("attn_q.bias"),
        )?; // [nh·hd, n]
        let k = linear(
            g,
            p,
            &mut ad,
            h,
            &name("attn_k.weight"),
            &name("attn_k.bias"),
        )?; // [nkv·hd, n]
        let v = linear(
            g,
            p,
            &mut ad,
            h,
            &name("attn_v.weight"),
            &name("attn_v.bias"),
        )?;
        let mut q = g.reshape(q, &[hd, nh, n])?;
        let mut k = g.reshape(k, &[hd, nkv, n])?;
        let v = g.reshape(v, &[hd, nkv, n])?;
        if let Some(w) = p.get(&name("attn_q_norm.weight")) {
            q = norm(g, q, w, hp.norm_eps)?;
        }
        if let Some(w) = p.get(&name("attn_k_norm.weight")) {
            k = norm(g, k, w, hp.norm_eps)?;
        }
        let q = g.rope_ext(q, pos, freqs, hp.rope)?; // [hd, nh, n]
        let k = g.rope_ext(k, pos, freqs, hp.rope)?; // [hd, nkv, n]
                                                     // One causal attention per sequence: views [hd, seq, heads] into the batch.
        let mut att: Option<TensorId> = None;
        for b in 0..shape.batch {
            let qb = g.view(q, &[hd, s, nh], &[hd * nh * 4, hd * 4], b * s * nh * hd * 4)?;
            let kb = g.view(
                k,
                &[hd, s, nkv],
                &[hd * nkv * 4, hd * 4],
                b * s * nkv * hd * 4,
            )?;
            let vb = g.view(
                v,
                &[hd, s, nkv],
                &[hd * nkv * 4, hd * 4],
                b * s * nkv * hd * 4,
            )?;
            let ab = g.flash_attn(qb, kb, vb, Some(mask), None, scale, 0.0)?; // [hd, nh, s]
            let ab = g.reshape(ab, &[nh * hd, s])?;
            att = Some(match att {
                Some(a) => g.concat(a, ab, 1)?,
                None => ab,
            });
        }
        let att = att.ok_or_else(|| TrainError::Invalid("the batch is empty".into()))?; // [nh·hd, n]
        let o = project(g, p, &mut ad, att, &name("attn_output.weight"))?; // [e, n]
        x = g.add(x, o)?;
        // Feed-forward.
        let h = norm(g, x, p.need(&name("ffn_norm.weight"))?, hp.norm_eps)?;
        let gate = project(g, p, &mut ad, h, &name("ffn_gate.weight"))?; // [ff, n]
        let up = project(g, p, &mut ad, h, &name("ffn_up.weight"))?;
        let act = g.swiglu(gate, up)?;
        let down = project(g, p, &mut ad, act, &name("ffn_down.weight"))?; // [e, n]
        x = g.add(x, down)?;
    }
    let h = norm(g, x, p.need("output_norm.weight")?, hp.norm_eps)?;
    // Tied embeddings: the head is the embedding table, which then gets both gradients.
    let head = p.get("output.weight").unwrap_or(tok_embd);
    let logits = g.mul_mat(head, h)?; // [n_vocab, n]
    g.set_name(logits, "logits")?;
    let loss = g.cross_entropy_loss(logits, labels)?;
    g.set_name(loss, "loss")?;
    g.set_output(loss)?;
    Ok(TrainForward {
        tokens,
        labels,
        pos,
        mask,
        freqs,
        logits,
        loss,
        dropout_masks: ad.masks,
    })
}
