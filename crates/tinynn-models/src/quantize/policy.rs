//! Which type each tensor of a model gets for a [`Target`]: our reading of the rules
//! llama.cpp's quantizer applies (`llama_tensor_get_type`), restricted to the architectures
//! tinynn runs (those with [`QuantRules`] in `crate::arch::REGISTRY`; no Falcon rules, no
//! importance matrix).
//!
//! - Only 2-D (or higher) tensors whose names end in `weight` are converted, never norms; the
//!   others keep their type.
//! - F32 / F16 / BF16 targets convert every such tensor to that type, nothing else.
//! - Quantized targets: `output.weight`, or `token_embd.weight` when the model has no output
//!   tensor (tied embeddings), gets Q6_K (Q8_0 if the row length is not a whole number of the
//!   target's blocks; Q8_0 stays Q8_0). Q4_K_M / Q5_K_M give Q6_K to the attn_v and ffn_down
//!   tensors of the layers [`use_more_bits`] picks; Q4_K_S gives Q5_K to the first four attn_v
//!   and the first eighth of the ffn_down tensors; Q2_K gives attn_v Q3_K (Q4_K when four or
//!   more query heads share a KV head) and ffn_down / attn_output Q3_K; Q3_K_M gives attn_v Q5_K
//!   (first two) or Q4_K, ffn_down Q5_K (first sixteenth) or Q4_K, attn_output Q4_K; Q3_K_L gives
//!   all three Q5_K; Q3_K_S keeps Q3_K. 70B-class models get Q5_K for the remaining Q3_K/Q4_K
//!   attn_v.
//! - Mixtures of experts: routers (`ffn_gate_inp`) are never converted; the stacked experts
//!   follow the ffn rules by their layer. With eight experts (Mixtral 8x) attn_k and attn_v get
//!   Q8_0, and attn_output gets Q5_K for Q2_K, Q3_K_S, Q3_K_M, Q4_K_S and Q4_K_M.
//! - A K type (256-element blocks) on a row length that is not a multiple of 256 falls back:
//!   Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, Q2_K/Q3_K → Q4_0; a row that does not even fit
//!   32-element blocks gets F16. Each fallback is reported.

use tinynn_format::GgmlType;

use super::target::Target;

/// A tensor as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

/// What the policy needs to know about the model beyond its tensors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShape {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    /// `{arch}.expert_count` (0: a dense model).
    pub n_expert: u64,
}

/// How llama.cpp recognizes a 70B-class model of an architecture (`LLM_TYPE_70B`), whose
/// Q4_K attn_v tensors get Q5_K.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class70b {
    Never,
    /// 80 layers (qwen2).
    Layers80,
    /// 80 layers with grouped KV heads (llama).
    Layers80Gqa,
}

/// An architecture's quantization rules beyond the common ones (its registry line's
/// `quantize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantRules {
    pub class_70b: Class70b,
}

impl ModelShape {
    /// Query heads per KV head (llama.cpp's `n_gqa()`; 0 when the file gives no KV heads).
    fn n_gqa(&self) -> u64 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B` as its quantizer infers it, by the architecture's rules.
    fn is_70b(&self) -> bool {
        let rules = crate::arch::by_name(&self.arch).and_then(|a| a.quantize);
        match rules.map(|r| r.class_70b) {
            Some(Class70b::Layers80Gqa) => self.n_layer == 80 && self.n_head != self.n_head_kv,
            Some(Class70b::Layers80) => self.n_layer == 80,
            Some(Class70b::Never) | None => false,
        }
    }
}

/// A K type was asked for but the row length does not allow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fallback {
    pub wanted: GgmlType,
    pub row_len: u64,
}

/// The decision for one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// The output type (the source type when the tensor is not converted).
    pub ty: GgmlType,
    pub fallback: Option<Fallback>,
}

/// Broad tensor roles, from the name alone (as llama.cpp's `tensor_get_category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Category {
    Output,
    TokenEmbd,
    AttnV,
    AttnK,
    AttnOutput,
    FfnDown,
    Other,
}

fn category(name: &str) -> Category {
    if name == "output.weight" {
        Category::Output
    } else if name == "token_embd.weight" {
        Category::TokenEmbd
    } else if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
        .iter()
        .any(|p| name.contains(p))
    {
        // Fused QKV and MLA's kv_b carry the values, so they count as attn_v.
        Category::AttnV
    } else if name.contains("attn_k.weight") {
        Category::AttnK
    } else if name.contains("attn_output.weight") {
        Category::AttnOutput
    } else if name.contains("ffn_down") {
        Category::FfnDown
    } else {
        Category::Other
    }
}

/// True if the tensor is a weight matrix that a quantization converts.
pub fn is_quantizable(name: &str, dims: &[u64]) -> bool {
    // ggml's n_dims ignores trailing dimensions of 1.
    let n_dims = dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    const KEEP: [&str; 6] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "position_embd.weight",
        "token_types.weight",
        "ssm_conv1d",
        "attn_rel_b.weight",
    ];
    n_dims >= 2 && name.ends_with("weight") && !KEEP.iter().any(|k| name.contains(k))
}

/// llama.cpp's choice of layers that get more bits: the first and last eighth, and every third
/// layer in between.
pub fn use_more_bits(i_layer: u64, n_layers: u64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// The layer number of a `blk.N.` name, for ordering.
fn layer_of(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest.find('.')?;
    rest[..end].parse().ok()
}

/// llama.cpp visits tensors sorted by layer (non-layer tensors first), then by name; its
/// "i-th attn_v" counters follow that order.
fn visit_order(tensors: &[TensorDesc]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by(|&a, &b| {
        let (ta, tb) = (&tensors[a], &tensors[b]);
        (layer_of(&ta.name), &ta.name).cmp(&(layer_of(&tb.name), &tb.name))
    });
    order
}

/// Per-tensor types for `target`, in the order of `tensors`.
pub fn choose_types(model: &ModelShape, target: Target, tensors: &[TensorDesc]) -> Vec<Choice> {
    let default = target.default_type();
    let tied = !tensors
        .iter()
        .any(|t| category(&t.name) == Category::Output);
    let n_attn_v = tensors
        .iter()
        .filter(|t| category(&t.name) == Category::AttnV)
        .count() as u64;
    let mut i_attn_v = 0u64;
    let mut i_ffn_down = 0u64;
    let mut out = vec![
        Choice {
            ty: GgmlType::F32,
            fallback: None,
        };
        tensors.len()
    ];
    for i in visit_order(tensors) {
        let t = &tensors[i];
        out[i] = if !is_quantizable(&t.name, &t.dims) {
            Choice {
                ty: t.ty,
                fallback: None,
            }
        } else if !default.is_quantized() {
            Choice {
                ty: default,
                fallback: None,
            }
        } else {
            let row_len = t.dims[0];
            let mut ty = default;
            match category(&t.name) {
                c @ (Category::Output | Category::TokenEmbd) if c == Category::Output || tied => {
                    if !row_len.is_multiple_of(default.layout().block_elems) {
                        ty = GgmlType::Q8_0;
                    } else if default != GgmlType::Q8_0 {
                        ty = GgmlType::Q6K;
                    }
                }
                Category::AttnV => {
                    let more = use_more_bits(i_attn_v, n_attn_v);
                    match target {
                        Target::Q2K if model.n_gqa() >= 4 => ty = GgmlType::Q4K,
                        Target::Q2K => ty = GgmlType::Q3K,
                        Target::Q3KM if i_attn_v < 2 => ty = GgmlType::Q5K,
                        Target::Q3KM => ty = GgmlType::Q4K,
                        Target::Q3KL => ty = GgmlType::Q5K,
                        Target::Q4KM | Target::Q5KM if more => ty = GgmlType::Q6K,
                        Target::Q4KS if i_attn_v < 4 => ty = GgmlType::Q5K,
                        _ => {}
                    }
                    if model.is_70b() && matches!(ty, GgmlType::Q3K | GgmlType::Q4K) {
                        ty = GgmlType::Q5K;
                    }
                    if model.n_expert == 8 {
                        // Eight experts (Mixtral 8x): the shared attention is a small part.
                        ty = GgmlType::Q8_0;
                    }
                    i_attn_v += 1;
                }
                Category::AttnK if model.n_expert == 8 => ty = GgmlType::Q8_0,
                Category::FfnDown => {
                    let (i, n) = (i_ffn_down, model.n_layer);
                    match target {
                        Target::Q2K => ty = GgmlType::Q3K,
                        Target::Q3KM if i < n / 16 => ty = GgmlType::Q5K,
                        Target::Q3KM => ty = GgmlType::Q4K,
                        Target::Q3KL => ty = GgmlType::Q5K,
                        Target::Q4KM | Target::Q5KM if use_more_bits(i, n) => ty = GgmlType::Q6K,
                        Target::Q4KS if i < n / 8 => ty = GgmlType::Q5K,
                        _ => {}
                    }
                    i_ffn_down += 1;
                }
                Category::AttnOutput if model.n_expert == 8 => {
                    if matches!(
                        target,
                        Target::Q2K | Target::Q3KS | Target::Q3KM | Target::Q4KS | Target::Q4KM
                    ) {
                        ty = GgmlType::Q5K;
                    }
                }
                Category::AttnOutput => match target {
                    Target::Q2K => ty = GgmlType::Q3K,
                    Target::Q3KM => ty = GgmlType::Q4K,
                    Target::Q3KL => ty = GgmlType::Q5K,
                    _ => {}
                },
                _ => {}
            }
            with_fallback(ty, row_len)
        };
    }
    out
}

/// `ty` if rows of `row_len` fit its blocks, else the type llama.cpp falls back to.
fn with_fallback(ty: GgmlType, row_len: u64) -> Choice {
    let fits = |t: GgmlType| row_len.is_multiple_of(t.layout().block_elems);
    if fits(ty) {
        return Choice { ty, fallback: None };
    }
    let mut got = match ty {
        GgmlType::Q2K | GgmlType::Q3K => GgmlType::Q4_0,
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        other => other,
    };
    if !fits(got) {
        got = GgmlType::F16;
    }
    Choice {
        ty: got,
        fallback: Some(Fallback {
            wanted: ty,
            row_len,
        }),
    }
}

#[cfg(test)]
#[path = "policy_tests.rs"]
mod tests;
