//! Scaled dot-product attention (GQA when there are fewer KV heads than query heads), one
//! `flash_attn` per layer, in one of two modes:
//!
//! - **KV cache** (inference): the tokens' K/V rows are written with `set_rows` into the
//!   persistent, head-major caches of the layer, and the queries attend over the cache's first
//!   `kv_len` rows through per-head views, with a mask when several tokens (or sequences) go
//!   at once.
//! - **Full sequence** (training): `batch` sequences of `seq` tokens, no cache; each sequence
//!   attends causally to its own keys only — the sequences are flash attention's batch
//!   dimension (a permuted view of q/k/v).

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use super::rope::RopeInputs;
use crate::{ModelError, Result};

/// The KV cache of an inference graph and its run-time inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCache {
    /// Rows (cells) per layer and KV head, shared by every sequence.
    pub n_cells: usize,
    /// F16 (as llama.cpp), F32 or BF16.
    pub cache_type: GgmlType,
    /// I32 `[n_head_kv · n_tokens]`: cache row of KV head h of token t, `h·n_cells + cell[t]`,
    /// at index `h + n_head_kv·t`.
    pub rows: TensorId,
    /// I32 `[1]`: attention reads cache rows `0..kv_len`.
    pub kv_len: TensorId,
    /// F32 `[n_cells, n_tokens]`: 0 where token i may attend to cache row j, -inf elsewhere.
    pub mask: Option<TensorId>,
    /// The same for the sliding-window layers (rows older than the window are -inf too).
    pub mask_swa: Option<TensorId>,
    /// The persistent caches made so far: K then V of each layer (a recurrent model's: the
    /// convolution then the scan state of each layer).
    pub caches: Vec<TensorId>,
    /// A recurrent model's state inputs (`super::recurrent`); `None` for attention.
    pub states: Option<super::recurrent::StateInputs>,
}

/// Where keys and values come from.
#[derive(Debug, PartialEq)]
pub enum AttnMode<'a> {
    /// Inference: through the KV cache.
    Cache(&'a mut KvCache),
    /// Training: `batch` sequences of `seq` tokens, token `t` of sequence `b` at `b·seq + t`.
    Full {
        batch: usize,
        seq: usize,
        /// F32 `[seq, seq]`: 0 where query i may see key j (j ≤ i), -inf elsewhere; present
        /// when some layer attends to the whole causal context.
        mask: Option<TensorId>,
        /// The same for the sliding-window layers (j ≤ i < j + window), when there are any.
        mask_swa: Option<TensorId>,
    },
}

/// How one layer attends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Score scale (`1/sqrt(head_dim)` for most models).
    pub scale: f32,
    /// Scores become `softcap·tanh(s/softcap)` (0: off).
    pub softcap: f32,
    /// The layer sees only the keys within the model's sliding window.
    pub sliding: bool,
}

impl AttnParams {
    /// Layer `l` of a model of `hp`: its window, the model's softcap, and `scale`.
    pub fn of_layer(hp: &crate::arch::Hparams, l: usize, scale: f32) -> AttnParams {
        AttnParams {
            scale,
            softcap: hp.attn_softcap,
            sliding: hp.is_swa(l),
        }
    }
}

/// The sliding-window mask where a layer uses it, else `mask`.
fn pick_mask(
    mask: Option<TensorId>,
    swa: Option<TensorId>,
    sliding: bool,
) -> Result<Option<TensorId>> {
    if !sliding {
        return Ok(mask);
    }
    swa.map(Some).ok_or_else(|| {
        ModelError::Invalid("a sliding-window layer in a graph without a window mask".into())
    })
}

/// What every layer's attention reads besides its own tensors.
#[derive(Debug, PartialEq)]
pub struct Attention<'a> {
    /// Tokens per run.
    pub n_tokens: usize,
    pub rope: RopeInputs,
    pub mode: AttnMode<'a>,
}

impl Attention<'_> {
    /// Attention of layer `layer`: queries q `[hd, nh, n]` over the keys k `[hd, nkv, n]`
    /// (both rotated) and values v `[nkv·hd, n]` of this run's tokens (and, with a cache, the
    /// earlier ones): `[nh·hd, n]`.
    pub fn attend(
        &mut self,
        g: &mut Graph,
        layer: usize,
        (q, k, v): (TensorId, TensorId, TensorId),
        p: AttnParams,
    ) -> Result<TensorId> {
        let (scale, softcap) = (p.scale, p.softcap);
        let n = self.n_tokens;
        let (hd, nh) = (g.layout(q).ne[0], g.layout(q).ne[1]);
        let nkv = g.layout(k).ne[1];
        let att = match &mut self.mode {
            AttnMode::Cache(kv) => {
                let (n_ctx, ty) = (kv.n_cells, kv.cache_type);
                let elem = ty.layout().block_bytes as usize;
                // Rows of K and V: head h of token t at h + nkv·t, as `kv.rows` indexes them.
                let k = g.reshape(k, &[hd, nkv * n])?; // [hd, nkv·n]
                let k_cache = g.persistent(&format!("cache_k.{layer}"), ty, &[hd, n_ctx * nkv])?;
                let v_cache = g.persistent(&format!("cache_v.{layer}"), ty, &[hd, n_ctx * nkv])?;
                kv.caches.extend([k_cache, v_cache]);
                let v = g.reshape(v, &[hd, nkv * n])?; // [hd, nkv·n]
                g.set_rows(k_cache, k, kv.rows)?;
                g.set_rows(v_cache, v, kv.rows)?;
                // Head-major: each KV head's rows are contiguous over positions.
                let head_stride = n_ctx * hd * elem;
                let kview = g.view(k_cache, &[hd, n_ctx, nkv], &[hd * elem, head_stride], 0)?;
                let vview = g.view(v_cache, &[hd, n_ctx, nkv], &[hd * elem, head_stride], 0)?;
                // q as [hd, n, nh]; the result over cache rows 0..kv_len is [hd, nh, n].
                let qh = g.permute(q, [0, 2, 1, 3])?;
                let mask = pick_mask(kv.mask, kv.mask_swa, p.sliding)?;
                g.flash_attn(qh, kview, vview, mask, Some(kv.kv_len), scale, softcap)?
            }
            AttnMode::Full {
                batch,
                seq,
                mask,
                mask_swa,
            } => {
                let (batch, seq) = (*batch, *seq);
                // Training attends causally always: a layer without its mask is a build error.
                let mask = pick_mask(*mask, *mask_swa, p.sliding)?.ok_or_else(|| {
                    ModelError::Invalid("a full-sequence layer without its causal mask".into())
                })?;
                if batch * seq != n {
                    return Err(ModelError::Invalid(format!(
                        "{batch} sequences of {seq} tokens are not the run's {n} tokens"
                    )));
                }
                // Tokens are sequence after sequence, so [hd, heads, n] is
                // [hd, heads, seq, batch], and swapping heads and positions gives attention's
                // [hd, seq, heads, batch] (a view).
                let v = g.reshape(v, &[hd, nkv, n])?; // [hd, nkv, n]
                let per_seq = |g: &mut Graph, t: TensorId, heads: usize| -> Result<TensorId> {
                    let t = g.reshape(t, &[hd, heads, seq, batch])?;
                    Ok(g.permute(t, [0, 2, 1, 3])?)
                };
                let (qb, kb, vb) = (per_seq(g, q, nh)?, per_seq(g, k, nkv)?, per_seq(g, v, nkv)?);
                // Causal, per sequence: [hd, nh, seq, batch].
                g.flash_attn(qb, kb, vb, Some(mask), None, scale, softcap)?
            }
        };
        Ok(g.reshape(att, &[nh * hd, n])?)
    }
}
