//! Builders for computing ops, each checking its operands before adding a node.

use tinynn_format::GgmlType;

use super::{err, Graph, Mem, Result};
use crate::ops::{Binary, Op, Unary};
use crate::quant;
use crate::tensor::{Layout, TensorId};

const F32: GgmlType = GgmlType::F32;

impl Graph {
    pub(super) fn f32_operand(&self, op: &'static str, t: TensorId) -> Result<Layout> {
        self.check_id(op, t)?;
        let l = *self.layout(t);
        if l.dtype != F32 {
            return err(
                op,
                format!("'{}' is {}, expected F32", self.node(t).name, l.dtype),
            );
        }
        Ok(l)
    }

    pub(super) fn f32_rows(&self, op: &'static str, t: TensorId) -> Result<Layout> {
        let l = self.f32_operand(op, t)?;
        if !l.rows_contiguous() {
            return err(op, format!("'{}' needs contiguous rows", self.node(t).name));
        }
        Ok(l)
    }

    /// `a · bᵀ` per batch: a `[K, N, b2, b3]` (weights, any supported type, contiguous rows),
    /// b `[K, M, c2, c3]` F32 with `c2 % b2 == 0` and `c3 % b3 == 0` → F32 `[N, M, c2, c3]`.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "mul_mat";
        self.check_id(OP, a)?;
        let la = *self.layout(a);
        let lb = self.f32_operand(OP, b)?;
        if quant::vec_dot_type(la.dtype).is_err() {
            return err(
                OP,
                format!("weights of type {} are not supported", la.dtype),
            );
        }
        if !la.rows_contiguous() {
            return err(OP, "the first operand needs contiguous rows");
        }
        if la.ne[0] != lb.ne[0] {
            return err(
                OP,
                format!("inner dimensions differ: {:?} · {:?}", la.ne, lb.ne),
            );
        }
        if lb.ne[2] % la.ne[2] != 0 || lb.ne[3] % la.ne[3] != 0 {
            return err(
                OP,
                format!(
                    "batch dims of {:?} do not broadcast over {:?}",
                    la.ne, lb.ne
                ),
            );
        }
        let layout = Layout::contiguous(F32, [la.ne[1], lb.ne[1], lb.ne[2], lb.ne[3]]);
        Ok(self.computed(Op::MulMat, layout, vec![a, b]))
    }

    /// Element-wise `a op b`, `b` repeated to `a`'s shape (each of its dims divides `a`'s).
    pub fn binary(&mut self, op: Binary, a: TensorId, b: TensorId) -> Result<TensorId> {
        let name = Op::Binary(op).name();
        let la = self.f32_operand(name, a)?;
        let lb = self.f32_operand(name, b)?;
        if (0..4).any(|i| la.ne[i] % lb.ne[i] != 0) {
            return err(
                name,
                format!("{:?} does not broadcast onto {:?}", lb.ne, la.ne),
            );
        }
        let layout = Layout::contiguous(F32, la.ne);
        Ok(self.computed(Op::Binary(op), layout, vec![a, b]))
    }

    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Binary::Add, a, b)
    }

    pub fn sub(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Binary::Sub, a, b)
    }

    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Binary::Mul, a, b)
    }

    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Binary::Div, a, b)
    }

    pub fn unary(&mut self, op: Unary, a: TensorId) -> Result<TensorId> {
        let la = self.f32_operand(Op::Unary(op).name(), a)?;
        Ok(self.computed(Op::Unary(op), Layout::contiguous(F32, la.ne), vec![a]))
    }

    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary(Unary::Silu, a)
    }

    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        let la = self.f32_operand("scale", a)?;
        Ok(self.computed(Op::Scale(s), Layout::contiguous(F32, la.ne), vec![a]))
    }

    /// Inverted dropout of `a` with probability `p` (in `[0, 1)`), the mask drawn from `seed`
    /// (I32 `[2]`, written before each run) and `salt` (one per dropout site): see
    /// [`Op::Dropout`].
    pub fn dropout(&mut self, a: TensorId, seed: TensorId, p: f32, salt: u32) -> Result<TensorId> {
        const OP: &str = "dropout";
        let la = self.f32_operand(OP, a)?;
        self.check_id(OP, seed)?;
        let ls = *self.layout(seed);
        if ls.dtype != GgmlType::I32 || ls.ne != [2, 1, 1, 1] {
            return err(
                OP,
                format!("the seed must be I32 [2], got {} {:?}", ls.dtype, ls.ne),
            );
        }
        if !(0.0..1.0).contains(&p) {
            return err(OP, format!("the probability must be in [0, 1), got {p}"));
        }
        Ok(self.computed(
            Op::Dropout { p, salt },
            Layout::contiguous(F32, la.ne),
            vec![a, seed],
        ))
    }

    /// `silu(gate) * up`, both the same shape.
    pub fn swiglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        const OP: &str = "swiglu";
        let lg = self.f32_operand(OP, gate)?;
        let lu = self.f32_operand(OP, up)?;
        if lg.ne != lu.ne {
            return err(OP, format!("shapes differ: {:?} and {:?}", lg.ne, lu.ne));
        }
        Ok(self.computed(Op::SwiGlu, Layout::contiguous(F32, lg.ne), vec![gate, up]))
    }

    /// `gelu(gate) * up` (tanh GELU), both the same shape.
    pub fn geglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        const OP: &str = "geglu";
        let lg = self.f32_operand(OP, gate)?;
        let lu = self.f32_operand(OP, up)?;
        if lg.ne != lu.ne {
            return err(OP, format!("shapes differ: {:?} and {:?}", lg.ne, lu.ne));
        }
        Ok(self.computed(Op::GeGlu, Layout::contiguous(F32, lg.ne), vec![gate, up]))
    }

    /// Layer normalization of each row, then `* weight + bias` (each `[ne0]`) when given.
    pub fn layer_norm(
        &mut self,
        a: TensorId,
        eps: f32,
        weight: Option<TensorId>,
        bias: Option<TensorId>,
    ) -> Result<TensorId> {
        const OP: &str = "layer_norm";
        let la = self.f32_rows(OP, a)?;
        if !(eps >= 0.0 && eps.is_finite()) {
            return err(OP, format!("eps {eps} must be a finite number ≥ 0"));
        }
        let mut src = vec![a];
        for t in [weight, bias].into_iter().flatten() {
            let l = self.f32_rows(OP, t)?;
            if l.ne != [la.ne[0], 1, 1, 1] {
                return err(
                    OP,
                    format!("weight and bias must be [{}], got {:?}", la.ne[0], l.ne),
                );
            }
            src.push(t);
        }
        let op = Op::LayerNorm {
            eps,
            has_weight: weight.is_some(),
            has_bias: bias.is_some(),
        };
        Ok(self.computed(op, Layout::contiguous(F32, la.ne), src))
    }

    /// RMS normalization of each row (no weight: multiply by one afterwards).
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        const OP: &str = "rms_norm";
        let la = self.f32_rows(OP, a)?;
        if !(eps >= 0.0 && eps.is_finite()) {
            return err(OP, format!("eps {eps} must be a finite number ≥ 0"));
        }
        Ok(self.computed(Op::RmsNorm { eps }, Layout::contiguous(F32, la.ne), vec![a]))
    }

    /// Rows of `table` `[K, R]` (any supported type) at I32 `indices` `[n]`, as F32 `[K, n]`.
    pub fn get_rows(&mut self, table: TensorId, indices: TensorId) -> Result<TensorId> {
        const OP: &str = "get_rows";
        self.check_id(OP, table)?;
        self.check_id(OP, indices)?;
        let (lt, li) = (*self.layout(table), *self.layout(indices));
        if quant::row_bytes(lt.dtype, lt.ne[0]).is_err()
            || !lt.rows_contiguous()
            || lt.ne[2] * lt.ne[3] != 1
        {
            return err(
                OP,
                format!(
                    "table must be a 2-D {} tensor with contiguous rows",
                    lt.dtype
                ),
            );
        }
        if li.dtype != GgmlType::I32 || li.n_dims() != 1 || !li.is_contiguous() {
            return err(
                OP,
                format!(
                    "indices must be a contiguous 1-D I32 tensor, got {} {:?}",
                    li.dtype, li.ne
                ),
            );
        }
        let layout = Layout::contiguous(F32, [lt.ne[0], li.ne[0], 1, 1]);
        Ok(self.computed(Op::GetRows, layout, vec![table, indices]))
    }

    /// Copies `src` into `dst` (same element count), converting to `dst`'s type; the result is
    /// `dst` after the copy. A `dst` in persistent memory (a KV cache view) keeps the write.
    pub fn cpy(&mut self, src: TensorId, dst: TensorId) -> Result<TensorId> {
        const OP: &str = "cpy";
        self.check_id(OP, src)?;
        self.check_id(OP, dst)?;
        let (ls, ld) = (*self.layout(src), *self.layout(dst));
        if ls.n_elements() != ld.n_elements() {
            return err(
                OP,
                format!("element counts differ: {:?} and {:?}", ls.ne, ld.ne),
            );
        }
        if quant::row_bytes(ls.dtype, ls.ne[0]).is_err() {
            return err(OP, format!("cannot read {} rows of {}", ls.dtype, ls.ne[0]));
        }
        if ls.dtype.is_quantized() && ls.ne[0] != ld.ne[0] {
            return err(OP, "quantized sources must keep their row length");
        }
        if !quant::has_quantizer(ld.dtype) {
            return err(OP, format!("cannot write {}", ld.dtype));
        }
        if ld.dtype.is_quantized() && (!ld.rows_contiguous() || ld.ne[0] != ls.ne[0]) {
            return err(
                OP,
                "a quantized destination needs contiguous rows as long as the source's",
            );
        }
        if self.node(self.root(dst).0).mem == Mem::Weight {
            return err(OP, "cannot write into a weight");
        }
        let id = self.computed(Op::Cpy, ld, vec![src, dst]);
        self.nodes[id.index()].mem = Mem::Alias {
            base: dst,
            offset: 0,
        };
        Ok(id)
    }

    /// Writes the F32 rows of `src` `[K, n]` into rows `indices` (I32 `[n]`) of `dst` `[K, R]`
    /// (arena or persistent, any writable type); the result is `dst` after the write.
    /// Indices past `R` are a run-time error.
    pub fn set_rows(
        &mut self,
        dst: TensorId,
        src: TensorId,
        indices: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "set_rows";
        let ls = self.f32_operand(OP, src)?;
        self.check_id(OP, dst)?;
        self.check_id(OP, indices)?;
        let (ld, li) = (*self.layout(dst), *self.layout(indices));
        if ld.ne[0] != ls.ne[0]
            || ld.ne[2] * ld.ne[3] != 1
            || ls.ne[2] * ls.ne[3] != 1
            || !ld.rows_contiguous()
        {
            return err(
                OP,
                format!(
                    "rows of {:?} do not fit a 2-D destination {:?}",
                    ls.ne, ld.ne
                ),
            );
        }
        if li.dtype != GgmlType::I32 || li.ne != [ls.ne[1], 1, 1, 1] || !li.is_contiguous() {
            return err(OP, format!("indices must be contiguous I32 [{}]", ls.ne[1]));
        }
        if !quant::has_quantizer(ld.dtype) {
            return err(OP, format!("cannot write {}", ld.dtype));
        }
        if self.node(self.root(dst).0).mem == Mem::Weight {
            return err(OP, "cannot write into a weight");
        }
        let id = self.computed(Op::SetRows, ld, vec![dst, src, indices]);
        self.nodes[id.index()].mem = Mem::Alias {
            base: dst,
            offset: 0,
        };
        Ok(id)
    }

    /// `a` and `b` (F32, equal in every other dimension) joined along `dim`.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        const OP: &str = "concat";
        let la = self.f32_operand(OP, a)?;
        let lb = self.f32_operand(OP, b)?;
        if dim >= 4 || (0..4).any(|i| i != dim && la.ne[i] != lb.ne[i]) {
            return err(
                OP,
                format!(
                    "{:?} and {:?} cannot be joined along dimension {dim}",
                    la.ne, lb.ne
                ),
            );
        }
        let mut ne = la.ne;
        ne[dim] += lb.ne[dim];
        Ok(self.computed(Op::Concat { dim }, Layout::contiguous(F32, ne), vec![a, b]))
    }

    /// A contiguous copy of `a` (same type).
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        const OP: &str = "cont";
        self.check_id(OP, a)?;
        let la = *self.layout(a);
        if la.dtype.is_quantized() && !la.rows_contiguous() {
            return err(OP, "quantized tensors need contiguous rows");
        }
        if quant::row_bytes(la.dtype, la.ne[0]).is_err() {
            return err(OP, format!("{} is not supported", la.dtype));
        }
        Ok(self.computed(Op::Cont, Layout::contiguous(la.dtype, la.ne), vec![a]))
    }
}
