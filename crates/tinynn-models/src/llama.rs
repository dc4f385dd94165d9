//! The Llama-family decoder as a graph: token embedding, `n_layer` blocks of RMSNorm → GQA
//! attention with RoPE → residual → RMSNorm → SwiGLU MLP → residual, final RMSNorm, output head
//! (tied to the embedding when the file has no `output.weight`).
//!
//! A forward graph handles `n_tokens` tokens at once (1 for decoding, a batch for prefill).
//! Positions and the cache length are run-time inputs, so a graph is compiled once and reused
//! for every call: the new K/V rows are written into the persistent, head-major caches with
//! `set_rows` at
//! their positions, and attention reads the first `kv_len` cache rows (with a causal mask when
//! several tokens go at once). Logits come for the last token, or for every token (`all_logits`,
//! for perplexity).

use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::{Architecture, ModelConfig, RopeScaling};
use tinynn_format::GgmlType;

use crate::lora::AppliedLora;
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// The numbers the graph needs, derived from the config.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaHparams {
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub norm_eps: f32,
    pub rope: Rope,
    /// Frequency divisors per rotated pair (Llama 3 scaling), when the config asks for them.
    pub freq_factors: Option<Vec<f32>>,
}

/// Llama 3's frequency divisors: 1 for short wavelengths, `factor` for long ones, a smooth
/// blend between (as transformers' `_compute_llama3_parameters` and llama.cpp's converter).
pub fn llama3_freq_factors(
    n_dims: usize,
    base: f64,
    factor: f64,
    low: f64,
    high: f64,
    old_ctx: f64,
) -> Vec<f32> {
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..n_dims / 2)
        .map(|i| {
            let freq = 1.0 / base.powf(2.0 * i as f64 / n_dims as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

impl LlamaHparams {
    /// `hf_layout`: weights as transformers stores them (RoPE on halves); GGUF Llama files
    /// permute q/k rows for adjacent pairs instead.
    pub fn from_config(c: &ModelConfig, hf_layout: bool) -> Result<LlamaHparams> {
        let mode = match c.architecture {
            Architecture::Llama | Architecture::Mistral if !hf_layout => RopeMode::Normal,
            Architecture::Llama
            | Architecture::Mistral
            | Architecture::Qwen2
            | Architecture::Qwen3 => RopeMode::Neox,
            ref other => {
                return Err(ModelError::UnsupportedArchitecture(
                    other.name().to_string(),
                ))
            }
        };
        let missing = |what: &str| ModelError::Invalid(format!("the model config lacks {what}"));
        let head_dim = c.head_dim as usize;
        let mut rope = Rope::new(
            mode,
            c.rope_dims.map_or(head_dim, |d| d as usize),
            c.rope_freq_base.unwrap_or(10_000.0) as f32,
        );
        match &c.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } if *factor > 0.0 => {
                rope.freq_scale = (1.0 / factor) as f32
            }
            // Llama 3: per-dimension frequency divisors (computed in `llama3_freq_factors`).
            RopeScaling::Llama3 { .. } => {}
            // YaRN: interpolate low frequencies, extrapolate high ones, scale cos/sin.
            RopeScaling::Yarn {
                factor,
                original_context,
                attn_factor,
                beta_fast,
                beta_slow,
            } if *factor > 0.0 => {
                rope.freq_scale = (1.0 / factor) as f32;
                rope.ext_factor = 1.0;
                rope.attn_factor = attn_factor.unwrap_or(1.0) as f32;
                rope.beta_fast = beta_fast.unwrap_or(32.0) as f32;
                rope.beta_slow = beta_slow.unwrap_or(1.0) as f32;
                rope.n_ctx_orig = original_context.or(c.n_ctx_train).unwrap_or(4096) as usize;
            }
            other => {
                return Err(ModelError::Invalid(format!(
                    "RoPE scaling {other:?} is not supported yet"
                )))
            }
        }
        Ok(LlamaHparams {
            n_embd: c.n_embd as usize,
            n_layer: c.n_layer as usize,
            n_head: c.n_head as usize,
            n_head_kv: c.n_head_kv as usize,
            head_dim,
            n_ff: c.n_ff.ok_or_else(|| missing("the feed-forward length"))? as usize,
            n_vocab: c.n_vocab.ok_or_else(|| missing("the vocabulary size"))? as usize,
            norm_eps: c.norm_eps.unwrap_or(1e-5) as f32,
            freq_factors: match c.rope_scaling {
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_context,
                } => Some(llama3_freq_factors(
                    rope.n_dims,
                    f64::from(rope.freq_base),
                    factor,
                    low_freq_factor.unwrap_or(1.0),
                    high_freq_factor.unwrap_or(4.0),
                    original_context.unwrap_or(8192) as f64,
                )),
                _ => None,
            },
            rope,
        })
    }
}

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
        }
    }
}

/// A forward graph and the tensors a session feeds and reads.
pub struct ForwardGraph {
    pub graph: Graph,
    pub hparams: LlamaHparams,
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
    /// (absent for a one-token run of an unmasked spec, which attends to every valid row).
    pub mask: Option<TensorId>,
    /// I32 `[n_out]`: which tokens' rows are output (only when `n_out < n_tokens`).
    pub out_ids: Option<TensorId>,
    /// The persistent K and V caches, per layer.
    pub caches: Vec<TensorId>,
    /// F32 `[n_dims/2]` RoPE frequency divisors to write once (`hparams.freq_factors`).
    pub freq_input: Option<TensorId>,
    /// F32 `[n_vocab, n_out]` logits, or `[n_embd, n_out]` hidden states with `spec.hidden`.
    pub output: TensorId,
    /// Graph weights and the GGUF tensors that back them (`<W>.lora_a`/`.lora_b`: the
    /// adapter's).
    pub weights: Vec<(TensorId, String)>,
}

struct Builder<'a> {
    g: Graph,
    src: WeightSource<'a>,
    weights: Vec<(TensorId, String)>,
    lora: Option<&'a AppliedLora>,
}

impl Builder<'_> {
    /// `w·x` for the weight leaf `w` (GGUF tensor `name`), plus the LoRA branch
    /// `factor·B·(A·x)` when the adapter adapts `name`.
    fn project(&mut self, w: TensorId, name: &str, x: TensorId) -> Result<TensorId> {
        let y = self.g.mul_mat(w, x)?;
        let Some(lora) = self.lora.as_ref() else {
            return Ok(y);
        };
        let Some(pair) = lora.adapter.pairs.get(name) else {
            return Ok(y);
        };
        let a = self
            .g
            .weight(&format!("{name}.lora_a"), pair.a.dtype, &pair.a.ne)?;
        let b = self
            .g
            .weight(&format!("{name}.lora_b"), pair.b.dtype, &pair.b.ne)?;
        self.weights.push((a, format!("{name}.lora_a")));
        self.weights.push((b, format!("{name}.lora_b")));
        let ax = self.g.mul_mat(a, x)?;
        let bax = self.g.mul_mat(b, ax)?;
        let branch = self.g.scale(bax, lora.adapter.factor(pair, lora.scale))?;
        Ok(self.g.add(y, branch)?)
    }

    /// A weight leaf for GGUF tensor `name`, whose dims must be `dims` (ggml order).
    fn weight(&mut self, name: &str, dims: &[usize]) -> Result<TensorId> {
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
        let t = self.g.weight(name, w.dtype, dims)?;
        self.weights.push((t, name.to_string()));
        Ok(t)
    }

    fn has(&self, name: &str) -> Result<bool> {
        Ok(self.src.get(name)?.is_some())
    }

    /// Qwen3's per-head RMSNorm of q or k (`[hd, heads, n]`) when the model has `name`.
    fn head_norm(&mut self, x: TensorId, name: &str, eps: f32, hd: usize) -> Result<TensorId> {
        if !self.has(name)? {
            return Ok(x);
        }
        self.norm(x, name, eps, hd)
    }

    /// `x + bias` when the model has `name` (Qwen2's q/k/v biases), else `x`.
    fn maybe_bias(&mut self, x: TensorId, name: &str, n: usize) -> Result<TensorId> {
        if !self.has(name)? {
            return Ok(x);
        }
        let b = self.weight(name, &[n])?;
        Ok(self.g.add(x, b)?)
    }

    /// `rms_norm(x) * weight`.
    fn norm(&mut self, x: TensorId, weight: &str, eps: f32, n: usize) -> Result<TensorId> {
        let w = self.weight(weight, &[n])?;
        let h = self.g.rms_norm(x, eps)?;
        Ok(self.g.mul(h, w)?)
    }
}

/// Builds the forward graph of a Llama-family model as `spec` says, with a LoRA adapter on
/// the projections it adapts (checked against the model with
/// [`crate::lora::LoraAdapter::check_base`] first).
pub fn forward_graph<'a>(
    src: WeightSource<'a>,
    config: &ModelConfig,
    spec: GraphSpec,
    lora: Option<&'a AppliedLora>,
) -> Result<ForwardGraph> {
    if let Some(l) = lora {
        l.adapter.check_base(&src)?;
    }
    let (cache_type, n_ctx, n_tokens) = (spec.cache_type, spec.n_cells, spec.n_tokens);
    if !matches!(cache_type, GgmlType::F16 | GgmlType::F32 | GgmlType::Bf16) {
        return Err(ModelError::Invalid(format!(
            "KV cache type {cache_type} is not supported"
        )));
    }
    let elem = cache_type.layout().block_bytes as usize;
    let hp = LlamaHparams::from_config(config, src.is_hf())?;
    if n_tokens == 0 || n_tokens > n_ctx {
        return Err(ModelError::Invalid(format!(
            "a batch of {n_tokens} tokens does not fit a context of {n_ctx}"
        )));
    }
    if spec.n_out == 0 || spec.n_out > n_tokens {
        return Err(ModelError::Invalid(format!(
            "{} outputs of a batch of {n_tokens} tokens",
            spec.n_out
        )));
    }
    let mut b = Builder {
        g: Graph::new(),
        src,
        weights: Vec::new(),
        lora,
    };
    let (e, hd, nh, nkv) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv);
    let n_embd_kv = hd * nkv;
    let n = n_tokens;
    let tokens = b.g.input("tokens", GgmlType::I32, &[n])?;
    let pos = b.g.input("pos", GgmlType::I32, &[n])?;
    let kv_len = b.g.input("kv_len", GgmlType::I32, &[1])?;
    let kv_rows = b.g.input("kv_rows", GgmlType::I32, &[hp.n_head_kv * n])?;
    let mask = if n > 1 || spec.masked {
        Some(b.g.input("mask", GgmlType::F32, &[n_ctx, n])?)
    } else {
        None
    };
    let mut caches = Vec::with_capacity(2 * hp.n_layer);
    // RoPE frequency divisors: a GGUF tensor (Llama 3 files carry `rope_freqs.weight`), or
    // computed from the config and written by the session.
    let n_pairs = hp.rope.n_dims / 2;
    let mut freq_input = None;
    let freqs = if b.has("rope_freqs.weight")? {
        Some(b.weight("rope_freqs.weight", &[n_pairs])?)
    } else if hp.freq_factors.is_some() {
        let t = b.g.input("rope_freqs", GgmlType::F32, &[n_pairs])?;
        freq_input = Some(t);
        Some(t)
    } else {
        None
    };
    let tok_embd = b.weight("token_embd.weight", &[e, hp.n_vocab])?;
    let mut x = b.g.get_rows(tok_embd, tokens)?; // [e, n]
    let scale = 1.0 / (hd as f32).sqrt();
    for l in 0..hp.n_layer {
        let p = |s: &str| format!("blk.{l}.{s}.weight");
        // Attention.
        let h = b.norm(x, &p("attn_norm"), hp.norm_eps, e)?;
        let wq = b.weight(&p("attn_q"), &[e, nh * hd])?;
        let wk = b.weight(&p("attn_k"), &[e, n_embd_kv])?;
        let wv = b.weight(&p("attn_v"), &[e, n_embd_kv])?;
        let q = b.project(wq, &p("attn_q"), h)?;
        let q = b.maybe_bias(q, &format!("blk.{l}.attn_q.bias"), nh * hd)?;
        let q = b.g.reshape(q, &[hd, nh, n])?;
        let q = b.head_norm(q, &format!("blk.{l}.attn_q_norm.weight"), hp.norm_eps, hd)?;
        let q = b.g.rope_ext(q, pos, freqs, hp.rope)?;
        let k = b.project(wk, &p("attn_k"), h)?;
        let k = b.maybe_bias(k, &format!("blk.{l}.attn_k.bias"), n_embd_kv)?;
        let k = b.g.reshape(k, &[hd, nkv, n])?;
        let k = b.head_norm(k, &format!("blk.{l}.attn_k_norm.weight"), hp.norm_eps, hd)?;
        let k = b.g.rope_ext(k, pos, freqs, hp.rope)?;
        let k = b.g.reshape(k, &[hd, nkv * n])?; // rows: head h of token t at h + nkv·t
        let v = b.project(wv, &p("attn_v"), h)?; // [n_embd_kv, n]
        let v = b.maybe_bias(v, &format!("blk.{l}.attn_v.bias"), n_embd_kv)?;
        let k_cache =
            b.g.persistent(&format!("cache_k.{l}"), cache_type, &[hd, n_ctx * nkv])?;
        let v_cache =
            b.g.persistent(&format!("cache_v.{l}"), cache_type, &[hd, n_ctx * nkv])?;
        caches.extend([k_cache, v_cache]);
        let v = b.g.reshape(v, &[hd, nkv * n])?;
        b.g.set_rows(k_cache, k, kv_rows)?;
        b.g.set_rows(v_cache, v, kv_rows)?;
        // Head-major: each KV head's rows are contiguous over positions.
        let head_stride = n_ctx * hd * elem;
        let kview =
            b.g.view(k_cache, &[hd, n_ctx, nkv], &[hd * elem, head_stride], 0)?;
        let vview =
            b.g.view(v_cache, &[hd, n_ctx, nkv], &[hd * elem, head_stride], 0)?;
        let qh = b.g.permute(q, [0, 2, 1, 3])?; // [hd, n, nh]
        let att =
            b.g.flash_attn(qh, kview, vview, mask, Some(kv_len), scale, 0.0)?; // [hd, nh, n]
        let att = b.g.reshape(att, &[nh * hd, n])?;
        let wo = b.weight(&p("attn_output"), &[nh * hd, e])?;
        let o = b.project(wo, &p("attn_output"), att)?;
        x = b.g.add(x, o)?;
        // Feed-forward.
        let h = b.norm(x, &p("ffn_norm"), hp.norm_eps, e)?;
        let wg = b.weight(&p("ffn_gate"), &[e, hp.n_ff])?;
        let wu = b.weight(&p("ffn_up"), &[e, hp.n_ff])?;
        let wd = b.weight(&p("ffn_down"), &[hp.n_ff, e])?;
        let gate = b.project(wg, &p("ffn_gate"), h)?;
        let up = b.project(wu, &p("ffn_up"), h)?;
        let act = b.g.swiglu(gate, up)?;
        let down = b.project(wd, &p("ffn_down"), act)?;
        x = b.g.add(x, down)?;
    }
    // The output rows: [e, n_out] from [e, n] (all n, or chosen by `out_ids`).
    let n_out = spec.n_out;
    let (x, out_ids) = if n_out == n {
        (x, None)
    } else {
        let ids = b.g.input("out_ids", GgmlType::I32, &[n_out])?;
        (b.g.get_rows(x, ids)?, Some(ids))
    };
    let h = b.norm(x, "output_norm.weight", hp.norm_eps, e)?;
    let output = if spec.hidden {
        h
    } else {
        let head = if b.has("output.weight")? {
            b.weight("output.weight", &[e, hp.n_vocab])?
        } else {
            tok_embd
        };
        b.g.mul_mat(head, h)?
    };
    b.g.set_name(output, if spec.hidden { "hidden" } else { "logits" })?;
    b.g.set_output(output)?;
    Ok(ForwardGraph {
        graph: b.g,
        hparams: hp,
        spec,
        tokens,
        pos,
        kv_len,
        kv_rows,
        mask,
        out_ids,
        caches,
        freq_input,
        output,
        weights: b.weights,
    })
}
