//! The closed set of operations a graph can hold, each with its typed parameters.

/// Element-wise functions of one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// GELU, exact (erf).
    GeluErf,
    Tanh,
    Exp,
    Sqr,
    Sqrt,
    Neg,
}

/// Element-wise functions of two tensors; the second broadcasts onto the first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binary {
    Add,
    Sub,
    Mul,
    Div,
}

/// How rotary embeddings pair up dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` (GGUF Llama files, whose q/k rows are permuted for it).
    Normal,
    /// Halves `(i, i + n_dims/2)` ("rotate half": NEOX, Qwen2 GGUF, HF safetensors).
    Neox,
}

/// Rotary embedding settings (ggml's `rope_ext`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub mode: RopeMode,
    /// Dimensions rotated, from the start of each head (partial rotary when < head size).
    pub n_dims: usize,
    pub freq_base: f32,
    /// Position scale (linear RoPE scaling is 1/factor).
    pub freq_scale: f32,
    /// YaRN extrapolation mix: 0 turns YaRN off, 1 for YaRN-scaled models.
    pub ext_factor: f32,
    /// Scale of cos/sin (YaRN's attention factor); 1 normally.
    pub attn_factor: f32,
    /// YaRN correction range, in rotations.
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Training context before scaling (YaRN's correction dims depend on it).
    pub n_ctx_orig: usize,
}

impl Rope {
    /// Plain RoPE: no scaling, no YaRN.
    pub fn new(mode: RopeMode, n_dims: usize, freq_base: f32) -> Rope {
        Rope {
            mode,
            n_dims,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }
}

/// An operation. Sources are the node's `src` list, in the order documented per variant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// Memory supplied from outside the plan (weights, inputs, persistent state); computes nothing.
    Leaf,
    /// An alias of its source's memory (view, reshape, permute, transpose); computes nothing.
    View,
    /// `[K,N,b2,b3] · [K,M,c2,c3] → [N,M,c2,c3]`: every row of src1 dotted with every row of
    /// src0 (src0 is the weight, any supported format; its batch dims broadcast over src1's).
    MulMat,
    Unary(Unary),
    Binary(Binary),
    /// `x * s`.
    Scale(f32),
    /// Inverted dropout: `src0 · keep / (1 − p)`, where element `i` (the output's flat index)
    /// is kept unless [`dropout_drops`]`(seed, salt, i, p)`, seed = src1 (I32 `[2]`, low word
    /// first). The mask is a pure function of its arguments: nothing is stored, and the
    /// gradient is the same op on `dy`.
    Dropout {
        p: f32,
        salt: u32,
    },
    /// `silu(src0) * src1`.
    SwiGlu,
    /// Gradient of `SwiGlu` in one pass: src0 g, src1 u, src2 dy (contiguous F32, one shape).
    /// The result is flat: `dg = dy·u·silu'(g)`, then `du = dy·silu(g)` (each in g's shape).
    SwiGluBack,
    /// `gelu(src0) * src1` (tanh approximation).
    GeGlu,
    /// `x / sqrt(mean(x²) + eps)` over each row.
    RmsNorm {
        eps: f32,
    },
    /// `(x - mean) / sqrt(var + eps)` over each row, then `* src1` and `+ src2` when present.
    LayerNorm {
        eps: f32,
        has_weight: bool,
        has_bias: bool,
    },
    /// Softmax over rows of `src0 * scale + slope * mask` (mask = src1 when `has_mask`,
    /// broadcast over dims 2, 3; `slope` is ALiBi's per-head slope from `max_bias`, 1 when 0).
    SoftMax {
        scale: f32,
        max_bias: f32,
        has_mask: bool,
    },
    /// Sets `x[i0, i1, ..] = -inf` where `i0 > n_past + i1` (causal masking without a mask).
    DiagMaskInf {
        n_past: usize,
    },
    /// Rotary embedding of src0 `[head_dim, n_head, n_tokens, 1]` at positions src1
    /// (I32 `[n_tokens]`), with per-dimension frequency divisors src2 (F32 `[n_dims/2]`) when
    /// `has_freq_factors` (Llama 3 / LongRoPE).
    Rope {
        rope: Rope,
        has_freq_factors: bool,
    },
    /// Attention per head: `softmax(q·kᵀ·scale [softcapped] + mask) · v`.
    /// Sources: q `[D, n_q, H, 1]` F32, k `[D, n_kv, H_kv, 1]`, v `[Dv, n_kv, H_kv, 1]`
    /// (F32/F16/BF16, H a multiple of H_kv), then the mask `[n_kv, ≥n_q]` F32 when `has_mask`,
    /// then an I32 `[1]` count of valid kv rows when `has_kv_len` (a decode plan's cache length).
    /// Output `[Dv, H, n_q, 1]` F32.
    FlashAttn {
        scale: f32,
        softcap: f32,
        has_mask: bool,
        has_kv_len: bool,
    },
    /// Rows of src0 `[K, R, ..]` picked by the I32 indices src1 `[n]`, as f32 `[K, n]`.
    GetRows,
    /// Copies (and converts) src0 into the memory of src1, whose layout is the result's.
    Cpy,
    /// A contiguous copy of src0.
    Cont,
    /// Writes rows of src1 (F32 `[K, n]`) into src0 at the I32 row indices src2 (`[n]`),
    /// converting to src0's type; the result is src0 after the write.
    SetRows,
    /// src0 and src1 joined along dimension `dim`.
    Concat {
        dim: usize,
    },
    /// The sum of all elements, `[1]`.
    Sum,
    /// The sum of the squares of all elements, `[1]` (a squared L2 norm in one pass).
    SumSq,
    /// The sum of each row, `[1, ne1, ne2, ne3]`.
    SumRows,
    /// The mean of each row, `[1, ne1, ne2, ne3]`.
    Mean,
    /// The index of each row's largest element (the first on ties), I32 `[ne1, ne2, ne3]`.
    Argmax,
    /// Indices that sort each row, I32, ascending or descending (stable).
    Argsort {
        descending: bool,
    },
    /// Indices of each row's `k` largest elements, largest first, I32 `[k, ne1, ...]`.
    TopK {
        k: usize,
    },
    /// `a [m, n, ..] ⊗ b [p, n, ..] → [m, p, ..]`: `Σ_k a[i, k]·b[j, k]` (the gradient of mul_mat).
    OutProd,
    /// Mixture of experts: for each token t and slot e, expert `ids[e, t]` of src0
    /// `[K, N, n_expert]` times row `(e mod ne1, t)` of src1 `[K, 1 or n_used, n_tokens]`
    /// → `[N, n_used, n_tokens]`. src2: I32 ids `[n_used, n_tokens]`.
    MulMatId,
    /// `src0 [n, n_used, n_tokens] + src1[:, ids[e, t]]` (per-expert biases); src2: I32 ids.
    AddId,
    /// Per column, the elements the ids name: `out[j, t] = src0[ids[j, t], t]` for src0 F32
    /// `[N, n]` and src1 I32 ids `[k, n]` → `[k, n]` (a token's chosen experts' weights).
    TakeRows,
    /// Gradient of `TakeRows`: src0 dy `[k, n]` added into elements `(ids[j, t], t)` of a zero
    /// `[N, n]`; src1: the ids.
    TakeRowsBack,
    /// Gradient of `MulMatId` for its activations: for each token t and slot e, expert
    /// `ids[e, t]` of src0 `[K, N, n_expert]` (any weight format) transposed times column
    /// `(e, t)` of src1 dy `[N, n_used, n_tokens]` → `[K, n_used, n_tokens]`. src2: the ids.
    MulMatIdT,
    /// Gradient of `MulMatId` for its experts: `out[:, :, x] = Σ_{(e, t): ids[e, t] = x}
    /// src0[:, e mod ne1, t] ⊗ src1[:, e, t]` for src0 activations `[K, 1 or n_used, n_tokens]`
    /// and src1 dy `[N, n_used, n_tokens]` → `[K, N, n_expert]`. src2: the ids.
    OutProdId,
    /// Mamba's causal depthwise convolution: src0 `[d_conv - 1 + n_t, d_inner, n_s]` (state
    /// then inputs), src1 weights `[d_conv, d_inner]` → `[d_inner, n_t, n_s]`.
    SsmConv,
    /// Mamba's selective scan over src0 state `[d_state, d_inner, n_s]`, x `[d_inner, n_t, n_s]`,
    /// dt `[d_inner, n_t, n_s]`, A `[d_state, d_inner]`, B and C `[d_state, n_t, n_s]` → the outputs
    /// `[d_inner, n_t, n_s]` followed by the final states `[d_state, d_inner, n_s]`, flat.
    SsmScan,
    /// Gradient of `SsmConv`: src0 its input `[d_conv - 1 + n_t, d_inner, n_s]`, src1 its
    /// weights `[d_conv, d_inner]`, src2 dy `[d_inner, n_t, n_s]` → the input's gradient then
    /// the weights', flat.
    SsmConvBack,
    /// Gradient of `SsmScan`: its six sources then dy (the outputs' and the final states'
    /// gradients, flat as its result) → flat: the initial state's gradient `[d_state,
    /// d_inner, n_s]`, x's and dt's `[d_inner, n_t, n_s]`, A's per sequence `[d_state,
    /// d_inner, n_s]` (sum them), B's and C's `[d_state, n_t, n_s]`.
    SsmScanBack,
    /// Image patches as columns: src1 input `[IW, IH, IC, N]` (src0 the kernel `[KW, KH, IC, OC]`,
    /// only its shape is used) → `[IC·KH·KW, OW, OH, N]`, zero outside the image.
    Im2Col {
        stride: [usize; 2],
        pad: [usize; 2],
        dilation: [usize; 2],
    },
    /// Mean over tokens of `-log softmax(src0 [V, n])[label]` for I32 labels src1 `[n]`;
    /// negative labels are masked out. `[1]`. With an F32 `[1]` src2, the sum is divided by
    /// src2's value instead of the count of scored tokens (one chunk of a larger batch's mean).
    CrossEntropyLoss,
    /// One AdamW step, in place: src0 parameter, src1 gradient, src2/src3 first and second
    /// moments (all F32, same shape), src4 F32 `[7]` hyperparameters
    /// `[lr, beta1, beta2, eps, weight_decay, 1/(1-beta1^t), 1/(1-beta2^t)]`. The result is the
    /// updated parameter.
    AdamW,
    /// One SGD step with momentum, in place: src0 parameter, src1 gradient, src2 velocity,
    /// src3 F32 `[3]` hyperparameters `[lr, momentum, weight_decay]`.
    Sgd,

    // ---- Gradient ops (built by `Graph::backward`; see `graph/backward_rules.rs`). ----
    /// Every element set to the value (no sources): the loss seed, zero gradients.
    Fill(f32),
    /// `dy · f'(x)` for src0 x and src1 dy (same shape).
    UnaryBack(Unary),
    /// src0 summed onto the result's shape, each of whose dims divides src0's (the gradient of
    /// a broadcast operand). Sums run in a fixed order, in f64.
    ReduceTo,
    /// src0 repeated to the result's shape (each of src0's dims divides it).
    Repeat,
    /// Gradient of `rms_norm` for src0 x and src1 dy (same shape, contiguous rows).
    RmsNormBack {
        eps: f32,
    },
    /// Gradient of plain layer normalization (no weight, no bias) for src0 x and src1 dy.
    LayerNormBack {
        eps: f32,
    },
    /// Gradient of softmax for src0 y (the softmax output) and src1 dy:
    /// `scale · y · (dy − Σ y·dy)` per row.
    SoftMaxBack {
        scale: f32,
    },
    /// Sets `x[i0, i1, ..] = 0` where `i0 > n_past + i1` (the gradient of `DiagMaskInf`).
    DiagMaskZero {
        n_past: usize,
    },
    /// The inverse rotation of `Rope` (the angle negated, cos/sin scaled the same): src0 dy,
    /// src1 positions, src2 frequency factors when `has_freq_factors`.
    RopeBack {
        rope: Rope,
        has_freq_factors: bool,
    },
    /// Gradient of `FlashAttn` (no kv length): sources q, k, v (all F32), the mask when
    /// `has_mask`, then dO `[Dv, H, n_q, B]`. The result is flat: dq, then dk, then dv (each
    /// contiguous in its operand's shape). Recomputes the attention rows; f64 sums.
    FlashAttnBack {
        scale: f32,
        softcap: f32,
        has_mask: bool,
    },
    /// Scatter-add of the rows of src0 dy `[K, n]` into rows src1 (I32 `[n]`) of a zero
    /// `[K, R]` result (the gradient of `GetRows`). A result row belongs to one thread; its
    /// contributions are added in index order.
    GetRowsBack,
    /// Gradient of the mean cross-entropy for src0 logits `[V, n]`, src1 labels, src2 the
    /// loss gradient `[1]`: `dl · (softmax(row) − onehot(label)) / count` (`/ src3` when the
    /// loss had a divisor src3).
    CrossEntropyLossBack,
    /// `Wᵀ · dy`: src0 W `[K, N, b2, b3]` (any weight format, dequantized on the fly), src1 dy
    /// `[N, M, c2, c3]` F32 → `[K, M, c2, c3]` (the gradient of `MulMat` for its activations).
    MulMatT,
    /// Gradient of a view: src0 dy (the view's shape) added into a zero tensor of the viewed
    /// tensor's shape. `offset` and `nb` place the view in the viewed tensor's memory, whose
    /// own byte strides are `src_nb` (nested: each stride spans the smaller ones).
    ViewBack {
        offset: usize,
        nb: [usize; 4],
        src_nb: [usize; 4],
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf => "leaf",
            Op::View => "view",
            Op::MulMat => "mul_mat",
            Op::Unary(u) => match u {
                Unary::Silu => "silu",
                Unary::GeluTanh => "gelu",
                Unary::GeluErf => "gelu_erf",
                Unary::Tanh => "tanh",
                Unary::Exp => "exp",
                Unary::Sqr => "sqr",
                Unary::Sqrt => "sqrt",
                Unary::Neg => "neg",
            },
            Op::Binary(b) => match b {
                Binary::Add => "add",
                Binary::Sub => "sub",
                Binary::Mul => "mul",
                Binary::Div => "div",
            },
            Op::Scale(_) => "scale",
            Op::SwiGlu => "swiglu",
            Op::SwiGluBack => "swiglu_back",
            Op::GeGlu => "geglu",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::SoftMax { .. } => "soft_max",
            Op::DiagMaskInf { .. } => "diag_mask_inf",
            Op::Rope { .. } => "rope",
            Op::FlashAttn { .. } => "flash_attn",
            Op::GetRows => "get_rows",
            Op::Cpy => "cpy",
            Op::Cont => "cont",
            Op::SetRows => "set_rows",
            Op::Dropout { .. } => "dropout",
            Op::Concat { .. } => "concat",
            Op::Sum => "sum",
            Op::SumSq => "sum_sq",
            Op::SumRows => "sum_rows",
            Op::Mean => "mean",
            Op::Argmax => "argmax",
            Op::Argsort { .. } => "argsort",
            Op::TopK { .. } => "top_k",
            Op::OutProd => "out_prod",
            Op::MulMatId => "mul_mat_id",
            Op::AddId => "add_id",
            Op::TakeRows => "take_rows",
            Op::TakeRowsBack => "take_rows_back",
            Op::MulMatIdT => "mul_mat_id_t",
            Op::OutProdId => "out_prod_id",
            Op::SsmConv => "ssm_conv",
            Op::SsmScan => "ssm_scan",
            Op::SsmConvBack => "ssm_conv_back",
            Op::SsmScanBack => "ssm_scan_back",
            Op::Im2Col { .. } => "im2col",
            Op::CrossEntropyLoss => "cross_entropy_loss",
            Op::AdamW => "adamw",
            Op::Sgd => "sgd",
            Op::Fill(_) => "fill",
            Op::UnaryBack(_) => "unary_back",
            Op::ReduceTo => "reduce_to",
            Op::Repeat => "repeat",
            Op::RmsNormBack { .. } => "rms_norm_back",
            Op::LayerNormBack { .. } => "layer_norm_back",
            Op::SoftMaxBack { .. } => "soft_max_back",
            Op::DiagMaskZero { .. } => "diag_mask_zero",
            Op::RopeBack { .. } => "rope_back",
            Op::FlashAttnBack { .. } => "flash_attn_back",
            Op::GetRowsBack => "get_rows_back",
            Op::CrossEntropyLossBack => "cross_entropy_loss_back",
            Op::MulMatT => "mul_mat_t",
            Op::ViewBack { .. } => "view_back",
        }
    }

    /// True for ops that compute (everything but leaves and views).
    pub fn computes(&self) -> bool {
        !matches!(self, Op::Leaf | Op::View)
    }

    /// Element-wise ops whose output may take over the memory of src0 when src0 dies here.
    pub fn can_run_in_place(&self) -> bool {
        matches!(
            self,
            Op::Unary(_) | Op::Binary(_) | Op::Scale(_) | Op::SwiGlu | Op::UnaryBack(_)
        )
    }
}

/// Whether dropout with probability `p` drops element `i` of the site `salt` under `seed`:
/// `dropout_bits(seed, salt, i) < dropout_threshold(p)`.
pub fn dropout_drops(seed: u64, salt: u32, i: u64, p: f32) -> bool {
    dropout_bits(seed, salt, i) < dropout_threshold(p)
}

/// The first of the two constants [`dropout_bits`] mixes its inputs with (seed + salt·A + i·B).
pub const DROPOUT_SALT_MUL: u64 = 0x9E37_79B9_7F4A_7C15;
/// The second (see [`DROPOUT_SALT_MUL`]).
pub const DROPOUT_INDEX_MUL: u64 = 0xD1B5_4A32_D192_ED03;

/// 24 uniform bits for element `i` of dropout site `salt` under `seed`: a counter-based hash
/// (SplitMix64's finalizer) of the three, so any thread computes any element's mask, forward
/// and backward alike.
pub fn dropout_bits(seed: u64, salt: u32, i: u64) -> u64 {
    let mut z = seed
        .wrapping_add(u64::from(salt).wrapping_mul(DROPOUT_SALT_MUL))
        .wrapping_add(i.wrapping_mul(DROPOUT_INDEX_MUL));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) >> 40
}

/// Elements whose [`dropout_bits`] are below this are dropped: `ceil(p · 2^24)`, so the
/// probability is `p` rounded up to a multiple of 2^-24.
pub fn dropout_threshold(p: f32) -> u64 {
    (f64::from(p) * 16_777_216.0).ceil() as u64
}
