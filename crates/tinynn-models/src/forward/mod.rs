//! The inference graph of a registered architecture (`crate::arch`): its decoder over the
//! model file's weights, with attention through the KV cache.
//!
//! A forward graph handles `n_tokens` tokens at once (1 for decoding, a batch for prefill).
//! Positions and the cache length are run-time inputs, so a graph is compiled once and reused
//! for every call: the new K/V rows are written into the persistent, head-major caches with
//! `set_rows` at their positions, and attention reads the first `kv_len` cache rows (with a
//! causal mask when several tokens go at once). Logits come for the last token, or for every
//! token (`all_logits`, for perplexity), or the final hidden states (embeddings).

pub(crate) mod leaves;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::GgmlType;

use crate::arch::{self, trunk, Hparams};
use crate::common::{Attention, AttnMode, Init, KvCache, Leaves, RopeInputs, StateInputs};
use crate::lora::AppliedLora;
use crate::weights::WeightSource;
use crate::{ModelError, Result};
use leaves::FileLeaves;

/// What a forward graph computes: how many cache rows and tokens, and which outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphSpec {
    /// Rows (cells) of the KV cache per layer and KV head, shared by every sequence.
    pub n_cells: usize,
    /// Tokens per run.
    pub n_tokens: usize,
    /// Output rows: every token's when `n_out == n_tokens`, else `n_out` rows chosen at run
    /// time by `out_ids`.
    pub n_out: usize,
    /// KV cache type: F16 as llama.cpp, F32 for reference runs.
    pub cache_type: GgmlType,
    /// Always take an attention mask (several sequences share the cache); without it a
    /// one-token run attends to every row below `kv_len`.
    pub masked: bool,
    /// Output the final normalized hidden states (`[n_embd, n_out]`, embeddings) instead of
    /// logits.
    pub hidden: bool,
    /// Recurrent models (Mamba): sequence slots the session holds (columns of the state
    /// tables).
    pub n_slots: usize,
    /// Recurrent models: the run's tokens are `n_seqs` sequences of `n_tokens / n_seqs`
    /// tokens each, sequence after sequence (1 for attention models).
    pub n_seqs: usize,
}

impl GraphSpec {
    /// One sequence, `n_tokens` tokens, the last token's logits.
    pub fn last_logits(n_cells: usize, n_tokens: usize, cache_type: GgmlType) -> GraphSpec {
        GraphSpec {
            n_cells,
            n_tokens,
            n_out: 1,
            cache_type,
            masked: false,
            hidden: false,
            n_slots: 1,
            n_seqs: 1,
        }
    }
}

/// A forward graph and the tensors a session feeds and reads.
pub struct ForwardGraph {
    pub graph: Graph,
    pub hparams: Hparams,
    pub spec: GraphSpec,
    /// I32 `[n_tokens]`: the tokens to run.
    pub tokens: TensorId,
    /// I32 `[n_tokens]`: their positions (in their own sequences).
    pub pos: TensorId,
    /// I32 `[1]`: attention reads cache rows `0..kv_len` (one past the highest row in use).
    pub kv_len: TensorId,
    /// I32 `[n_head_kv · n_tokens]`: cache row of KV head h of token t, `h·n_cells + cell[t]`,
    /// at index `h + n_head_kv·t` (the caches are head-major: `[head_dim, n_cells · n_head_kv]`).
    pub kv_rows: TensorId,
    /// F32 `[n_cells, n_tokens]`: 0 where token i may attend to cache row j, -inf elsewhere
    /// (absent for a one-token run of an unmasked spec, which attends to every valid row, and
    /// when every layer is a sliding-window layer).
    pub mask: Option<TensorId>,
    /// F32 `[n_cells, n_tokens]`: the sliding-window layers' mask (rows older than the window
    /// are -inf too); present whenever the model has such layers.
    pub mask_swa: Option<TensorId>,
    /// I32 `[n_out]`: which tokens' rows are output (only when `n_out < n_tokens`).
    pub out_ids: Option<TensorId>,
    /// The persistent K and V caches, per layer (a recurrent model's state tables).
    pub caches: Vec<TensorId>,
    /// Recurrent models: I32 `[n_seqs]`, the state slot of each sequence of the run.
    pub state_slots: Option<TensorId>,
    /// Recurrent models: F32 `[1, n_seqs]`, 1 where a sequence continues from its slot's
    /// state, 0 where it starts fresh.
    pub state_keep: Option<TensorId>,
    /// F32 `[n_dims/2]` RoPE frequency divisors to write once (`hparams.freq_factors`).
    pub freq_input: Option<TensorId>,
    /// F32 `[n_vocab, n_out]` logits, or `[n_embd, n_out]` hidden states with `spec.hidden`.
    pub output: TensorId,
    /// Graph weights and the GGUF tensors that back them (`<W>.lora_a`/`.lora_b`: the
    /// adapter's).
    pub weights: Vec<(TensorId, String)>,
}

/// The KV cache types: F16 (as llama.cpp), F32 (strict runs) and BF16.
fn check_cache_type(ty: GgmlType) -> Result<()> {
    if !matches!(ty, GgmlType::F16 | GgmlType::F32 | GgmlType::Bf16) {
        return Err(ModelError::Invalid(format!(
            "KV cache type {ty} is not supported"
        )));
    }
    Ok(())
}

/// The batch fits the context, and the outputs the batch.
fn check_counts(spec: &GraphSpec) -> Result<()> {
    let (n_ctx, n_tokens) = (spec.n_cells, spec.n_tokens);
    if n_tokens == 0 || n_tokens > n_ctx {
        return Err(ModelError::Invalid(format!(
            "a batch of {n_tokens} tokens does not fit a context of {n_ctx}"
        )));
    }
    if spec.n_seqs == 0 || !n_tokens.is_multiple_of(spec.n_seqs) || spec.n_seqs > spec.n_slots {
        return Err(ModelError::Invalid(format!(
            "{n_tokens} tokens are not {} sequences of equal length among {} slots",
            spec.n_seqs, spec.n_slots
        )));
    }
    if spec.n_out == 0 || spec.n_out > n_tokens {
        return Err(ModelError::Invalid(format!(
            "{} outputs of a batch of {n_tokens} tokens",
            spec.n_out
        )));
    }
    Ok(())
}

/// Builds the forward graph of the model `config` describes as `spec` says, with each LoRA
/// adapter of `lora` on the projections it adapts (each checked against the model with
/// [`crate::lora::LoraAdapter::check_base`] first; their branches add up).
pub fn forward_graph<'a>(
    src: WeightSource<'a>,
    config: &ModelConfig,
    spec: GraphSpec,
    lora: &'a [AppliedLora],
) -> Result<ForwardGraph> {
    for l in lora {
        l.adapter.check_base(&src)?;
    }
    check_cache_type(spec.cache_type)?;
    let mut hp = Hparams::from_config(config, src.is_hf())?;
    hp.for_context(spec.n_cells);
    check_counts(&spec)?;
    let dec = arch::of_config(config)?.decoder;
    let mut g = Graph::new();
    let mut lv = FileLeaves {
        src,
        lora,
        weights: Vec::new(),
    };
    let n = spec.n_tokens;
    let tokens = g.input("tokens", GgmlType::I32, &[n])?;
    let pos = g.input("pos", GgmlType::I32, &[n])?;
    let kv_len = g.input("kv_len", GgmlType::I32, &[1])?;
    // (A model without attention never reads it; inputs cannot be empty.)
    let kv_rows = g.input("kv_rows", GgmlType::I32, &[hp.n_head_kv.max(1) * n])?;
    // A window hides old rows even from a lone token, so windowed models always take masks;
    // the plain one only when some layer reads it (an input no step reads is not planned).
    let recurrent = hp.ssm.is_some();
    let mask = if (n > 1 || spec.masked || hp.swa.is_some()) && hp.has_global_layers() && !recurrent
    {
        Some(g.input("mask", GgmlType::F32, &[spec.n_cells, n])?)
    } else {
        None
    };
    let mask_swa = match hp.swa {
        Some(_) => Some(g.input("mask_swa", GgmlType::F32, &[spec.n_cells, n])?),
        None => None,
    };
    // RoPE frequency divisors: a GGUF tensor (Llama 3 files carry `rope_freqs.weight`), or
    // computed from the config and written by the session.
    let n_pairs = hp.rope.n_dims / 2;
    let mut freq_input = None;
    // LongRoPE files (Phi-3) keep short and long divisors; the context picks one.
    let file_freqs = match (&hp.longrope, hp.uses_long_factors(spec.n_cells)) {
        (None, _) => "rope_freqs.weight",
        (Some(_), false) => "rope_factors_short.weight",
        (Some(_), true) => "rope_factors_long.weight",
    };
    let freqs = if lv.has(file_freqs)? {
        Some(lv.tensor(&mut g, file_freqs, &[n_pairs], Init::Ones)?)
    } else if hp.freq_factors.is_some() {
        let t = g.input("rope_freqs", GgmlType::F32, &[n_pairs])?;
        freq_input = Some(t);
        Some(t)
    } else {
        None
    };
    let states = if recurrent {
        Some(StateInputs {
            n_slots: spec.n_slots,
            n_seqs: spec.n_seqs,
            slots: g.input("state_slots", GgmlType::I32, &[spec.n_seqs])?,
            keep: g.input("state_keep", GgmlType::F32, &[1, spec.n_seqs])?,
        })
    } else {
        None
    };
    let mut cache = KvCache {
        n_cells: spec.n_cells,
        cache_type: spec.cache_type,
        rows: kv_rows,
        kv_len,
        mask,
        mask_swa,
        caches: Vec::with_capacity(2 * hp.n_layer),
        states,
    };
    let mut at = Attention {
        n_tokens: n,
        rope: RopeInputs { pos, freqs },
        mode: AttnMode::Cache(&mut cache),
    };
    let t = trunk(dec, &mut g, &mut lv, &hp, &mut at, tokens)?; // x: [e, n]

    // The output rows: [e, n_out] from [e, n] (all n, or chosen by `out_ids`).
    let (x, out_ids) = if spec.n_out == n {
        (t.x, None)
    } else {
        let ids = g.input("out_ids", GgmlType::I32, &[spec.n_out])?;
        (g.get_rows(t.x, ids)?, Some(ids))
    };
    let h = dec.output_norm(&mut g, &mut lv, &hp, x)?; // [e, n_out]
    let output = if spec.hidden {
        h
    } else {
        let head = dec.head(&mut g, &mut lv, &hp, t.table)?; // [e, n_vocab]
        arch::logits(&mut g, &hp, head, h)? // [n_vocab, n_out]
    };
    g.set_name(output, if spec.hidden { "hidden" } else { "logits" })?;
    g.set_output(output)?;
    Ok(ForwardGraph {
        graph: g,
        hparams: hp,
        spec,
        tokens,
        pos,
        kv_len,
        kv_rows,
        mask,
        mask_swa,
        out_ids,
        caches: cache.caches,
        state_slots: states.map(|s| s.slots),
        state_keep: states.map(|s| s.keep),
        freq_input,
        output,
        weights: lv.weights,
    })
}
