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

/// Rotary embedding settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rope {
    pub mode: RopeMode,
    /// Dimensions rotated, from the start of each head (partial rotary when < head size).
    pub n_dims: usize,
    pub freq_base: f32,
    /// Position scale (linear RoPE scaling is 1/factor).
    pub freq_scale: f32,
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
    /// `silu(src0) * src1`.
    SwiGlu,
    /// `x / sqrt(mean(x²) + eps)` over each row.
    RmsNorm {
        eps: f32,
    },
    /// Softmax over rows of `src0 * scale (+ src1 mask, broadcast over dims 2, 3)`.
    SoftMax {
        scale: f32,
    },
    /// Rotary embedding of src0 `[head_dim, n_head, n_tokens, 1]` at positions src1 (I32 `[n_tokens]`).
    Rope(Rope),
    /// Rows of src0 `[K, R, ..]` picked by the I32 indices src1 `[n]`, as f32 `[K, n]`.
    GetRows,
    /// Copies (and converts) src0 into the memory of src1, whose layout is the result's.
    Cpy,
    /// A contiguous copy of src0.
    Cont,
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
            Op::RmsNorm { .. } => "rms_norm",
            Op::SoftMax { .. } => "soft_max",
            Op::Rope(_) => "rope",
            Op::GetRows => "get_rows",
            Op::Cpy => "cpy",
            Op::Cont => "cont",
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
            Op::Unary(_) | Op::Binary(_) | Op::Scale(_) | Op::SwiGlu
        )
    }
}
