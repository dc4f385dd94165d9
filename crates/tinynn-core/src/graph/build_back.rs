//! Builders for the gradient ops that `Graph::backward` emits. They are ordinary ops (checked
//! shapes, typed errors) and can be used directly.

use tinynn_format::GgmlType;

use super::{err, full_shape, Graph, Result};
use crate::ops::{Op, Rope, Unary};
use crate::quant;
use crate::tensor::{Layout, TensorId, MAX_DIMS};

const F32: GgmlType = GgmlType::F32;

impl Graph {
    fn same_shape(&self, op: &'static str, a: TensorId, b: TensorId) -> Result<Layout> {
        let la = self.f32_operand(op, a)?;
        let lb = self.f32_operand(op, b)?;
        if la.ne != lb.ne {
            return err(op, format!("shapes differ: {:?} and {:?}", la.ne, lb.ne));
        }
        Ok(la)
    }

    /// A new F32 tensor of shape `ne` with every element `value`.
    pub fn fill(&mut self, ne: &[usize], value: f32) -> Result<TensorId> {
        let ne = full_shape("fill", ne)?;
        Ok(self.computed(Op::Fill(value), Layout::contiguous(F32, ne), vec![]))
    }

    /// `dy · f'(x)` (x and dy the same shape).
    pub fn unary_back(&mut self, op: Unary, x: TensorId, dy: TensorId) -> Result<TensorId> {
        let l = self.same_shape("unary_back", x, dy)?;
        Ok(self.computed(
            Op::UnaryBack(op),
            Layout::contiguous(F32, l.ne),
            vec![x, dy],
        ))
    }

    /// `a` summed onto shape `ne` (each dimension of `ne` divides `a`'s): the gradient of an
    /// operand that was broadcast.
    pub fn reduce_to(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        const OP: &str = "reduce_to";
        let la = self.f32_operand(OP, a)?;
        let ne = full_shape(OP, ne)?;
        if (0..MAX_DIMS).any(|i| la.ne[i] % ne[i] != 0) {
            return err(OP, format!("{ne:?} does not divide {:?}", la.ne));
        }
        Ok(self.computed(Op::ReduceTo, Layout::contiguous(F32, ne), vec![a]))
    }

    /// `a` repeated to shape `ne` (each of `a`'s dimensions divides `ne`'s).
    pub fn repeat(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        const OP: &str = "repeat";
        let la = self.f32_operand(OP, a)?;
        let ne = full_shape(OP, ne)?;
        if (0..MAX_DIMS).any(|i| ne[i] % la.ne[i] != 0) {
            return err(OP, format!("{:?} does not repeat onto {ne:?}", la.ne));
        }
        Ok(self.computed(Op::Repeat, Layout::contiguous(F32, ne), vec![a]))
    }

    /// Gradient of `rms_norm(x, eps)` given dy.
    pub fn rms_norm_back(&mut self, x: TensorId, dy: TensorId, eps: f32) -> Result<TensorId> {
        const OP: &str = "rms_norm_back";
        let l = self.same_shape(OP, x, dy)?;
        self.f32_rows(OP, x)?;
        self.f32_rows(OP, dy)?;
        Ok(self.computed(
            Op::RmsNormBack { eps },
            Layout::contiguous(F32, l.ne),
            vec![x, dy],
        ))
    }

    /// Gradient of plain `layer_norm(x, eps)` (no weight or bias) given dy.
    pub fn layer_norm_back(&mut self, x: TensorId, dy: TensorId, eps: f32) -> Result<TensorId> {
        const OP: &str = "layer_norm_back";
        let l = self.same_shape(OP, x, dy)?;
        self.f32_rows(OP, x)?;
        self.f32_rows(OP, dy)?;
        Ok(self.computed(
            Op::LayerNormBack { eps },
            Layout::contiguous(F32, l.ne),
            vec![x, dy],
        ))
    }

    /// Gradient of a softmax with output `y` given dy, times `scale`.
    pub fn soft_max_back(&mut self, y: TensorId, dy: TensorId, scale: f32) -> Result<TensorId> {
        const OP: &str = "soft_max_back";
        let l = self.same_shape(OP, y, dy)?;
        self.f32_rows(OP, y)?;
        self.f32_rows(OP, dy)?;
        Ok(self.computed(
            Op::SoftMaxBack { scale },
            Layout::contiguous(F32, l.ne),
            vec![y, dy],
        ))
    }

    /// `a` with zeros where `i0 > n_past + i1`.
    pub fn diag_mask_zero(&mut self, a: TensorId, n_past: usize) -> Result<TensorId> {
        let la = self.f32_rows("diag_mask_zero", a)?;
        Ok(self.computed(
            Op::DiagMaskZero { n_past },
            Layout::contiguous(F32, la.ne),
            vec![a],
        ))
    }

    /// The inverse rotary embedding (gradient of `rope_ext` with the same settings).
    pub fn rope_back(
        &mut self,
        dy: TensorId,
        positions: TensorId,
        freq_factors: Option<TensorId>,
        rope: Rope,
    ) -> Result<TensorId> {
        // The forward builder checks everything; reuse it, then retag the node.
        let t = self.rope_ext(dy, positions, freq_factors, rope)?;
        let node = &mut self.nodes[t.index()];
        node.op = Op::RopeBack {
            rope,
            has_freq_factors: freq_factors.is_some(),
        };
        node.name = format!("rope_back#{}", t.0);
        Ok(t)
    }

    /// Gradient of `flash_attn(q, k, v, mask, None, scale, softcap)` given `d_out`
    /// `[Dv, H, n_q, B]`: one flat F32 tensor holding dq, dk, dv, each contiguous in its
    /// tensor's shape (see [`Op::FlashAttnBack`]).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_back(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: Option<TensorId>,
        d_out: TensorId,
        scale: f32,
        softcap: f32,
    ) -> Result<TensorId> {
        const OP: &str = "flash_attn_back";
        for t in [k, v] {
            self.f32_rows(OP, t)?;
        }
        // Shapes as the forward op checks them.
        let fwd = self.flash_attn(q, k, v, mask, None, scale, softcap)?;
        let lo = *self.layout(fwd);
        self.nodes.pop();
        let ld = self.f32_operand(OP, d_out)?;
        if ld.ne != lo.ne {
            return err(
                OP,
                format!("d_out {:?} must have the output's shape {:?}", ld.ne, lo.ne),
            );
        }
        let n = [q, k, v]
            .iter()
            .map(|&t| self.layout(t).n_elements())
            .sum::<usize>();
        let mut src = vec![q, k, v];
        src.extend(mask);
        src.push(d_out);
        let op = Op::FlashAttnBack {
            scale,
            softcap,
            has_mask: mask.is_some(),
        };
        Ok(self.computed(op, Layout::contiguous(F32, [n, 1, 1, 1]), src))
    }

    /// Both gradients of `swiglu(g, u)` given `dy`, in one pass: a flat F32 tensor holding dg
    /// then du, each contiguous in g's shape ([`Op::SwiGluBack`]). All three must be contiguous
    /// F32 of one shape.
    pub fn swiglu_back(&mut self, g: TensorId, u: TensorId, dy: TensorId) -> Result<TensorId> {
        const OP: &str = "swiglu_back";
        let l = self.same_shape(OP, g, u)?;
        self.same_shape(OP, g, dy)?;
        if [g, u, dy].iter().any(|&t| !self.layout(t).is_contiguous()) {
            return err(OP, "g, u and dy must be contiguous");
        }
        Ok(self.computed(
            Op::SwiGluBack,
            Layout::contiguous(F32, [2 * l.n_elements(), 1, 1, 1]),
            vec![g, u, dy],
        ))
    }

    /// Rows of `dy` `[K, n]` added into rows `indices` (I32 `[n]`) of a zero F32 `[K, n_rows]`.
    pub fn get_rows_back(
        &mut self,
        dy: TensorId,
        indices: TensorId,
        n_rows: usize,
    ) -> Result<TensorId> {
        const OP: &str = "get_rows_back";
        let ld = self.f32_rows(OP, dy)?;
        self.check_id(OP, indices)?;
        let li = *self.layout(indices);
        if li.dtype != GgmlType::I32 || li.ne != [ld.ne[1], 1, 1, 1] || !li.is_contiguous() {
            return err(OP, format!("indices must be contiguous I32 [{}]", ld.ne[1]));
        }
        if ld.ne[2] * ld.ne[3] != 1 || n_rows == 0 {
            return err(OP, "expects dy [K, n] and at least one row");
        }
        Ok(self.computed(
            Op::GetRowsBack,
            Layout::contiguous(F32, [ld.ne[0], n_rows, 1, 1]),
            vec![dy, indices],
        ))
    }

    /// Gradient of `cross_entropy_loss(logits, labels)` given the loss gradient `dl` `[1]`.
    pub fn cross_entropy_loss_back(
        &mut self,
        logits: TensorId,
        labels: TensorId,
        dl: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "cross_entropy_loss_back";
        let probe = self.cross_entropy_loss(logits, labels)?;
        let l = *self.layout(probe);
        self.nodes.pop();
        let ldl = self.f32_operand(OP, dl)?;
        if ldl.ne != l.ne {
            return err(OP, "the loss gradient must be F32 [1]");
        }
        let ne = self.layout(logits).ne;
        Ok(self.computed(
            Op::CrossEntropyLossBack,
            Layout::contiguous(F32, ne),
            vec![logits, labels, dl],
        ))
    }

    /// The gradient of [`Graph::cross_entropy_loss_normalized`]: divides by `norm[0]` instead
    /// of the count of scored tokens.
    pub fn cross_entropy_loss_normalized_back(
        &mut self,
        logits: TensorId,
        labels: TensorId,
        norm: TensorId,
        dl: TensorId,
    ) -> Result<TensorId> {
        let ln = self.f32_operand("cross_entropy_loss_back", norm)?;
        if ln.n_elements() != 1 || !ln.is_contiguous() {
            return err("cross_entropy_loss_back", "the divisor must be F32 [1]");
        }
        let d = self.cross_entropy_loss_back(logits, labels, dl)?;
        self.nodes[d.index()].src.push(norm);
        Ok(d)
    }

    /// `wᵀ · dy`: w `[K, N, b2, b3]` (any weight type, contiguous rows), dy `[N, M, c2, c3]` F32
    /// with `c2 % b2 == 0`, `c3 % b3 == 0` → F32 `[K, M, c2, c3]`.
    pub fn mul_mat_t(&mut self, w: TensorId, dy: TensorId) -> Result<TensorId> {
        const OP: &str = "mul_mat_t";
        self.check_id(OP, w)?;
        let lw = *self.layout(w);
        let ld = self.f32_operand(OP, dy)?;
        if quant::row_bytes(lw.dtype, lw.ne[0]).is_err() || !lw.rows_contiguous() {
            return err(
                OP,
                format!("weights of type {} need contiguous rows", lw.dtype),
            );
        }
        if ld.ne[0] != lw.ne[1] || ld.ne[2] % lw.ne[2] != 0 || ld.ne[3] % lw.ne[3] != 0 {
            return err(OP, format!("{:?}ᵀ · {:?} do not fit", lw.ne, ld.ne));
        }
        let layout = Layout::contiguous(F32, [lw.ne[0], ld.ne[1], ld.ne[2], ld.ne[3]]);
        Ok(self.computed(Op::MulMatT, layout, vec![w, dy]))
    }

    /// Gradient of view `v` of tensor `s`: `dy` (v's shape) added into a zero tensor of s's
    /// shape. s's strides must be nested (each spans the smaller ones), as every contiguous
    /// tensor and every permutation of one are.
    pub fn view_back(&mut self, dy: TensorId, v: TensorId) -> Result<TensorId> {
        const OP: &str = "view_back";
        self.check_id(OP, v)?;
        let node = self.node(v);
        let (Op::View, super::Mem::Alias { base, offset }) = (node.op, node.mem) else {
            return err(OP, format!("'{}' is not a view", node.name));
        };
        let (lv, ls) = (node.layout, *self.layout(base));
        let ld = self.f32_operand(OP, dy)?;
        if ld.ne != lv.ne || ls.dtype != F32 {
            return err(
                OP,
                format!(
                    "dy {:?} must be F32 shaped like the view {:?}",
                    ld.ne, lv.ne
                ),
            );
        }
        let mut dims: Vec<usize> = (0..MAX_DIMS).filter(|&d| ls.ne[d] > 1).collect();
        dims.sort_by_key(|&d| ls.nb[d]);
        let mut span = 4;
        for &d in &dims {
            if ls.nb[d] < span {
                return err(
                    OP,
                    format!(
                        "the viewed tensor's strides {:?} are not nested; make it contiguous first",
                        ls.nb
                    ),
                );
            }
            span = ls.nb[d] * ls.ne[d];
        }
        let op = Op::ViewBack {
            offset,
            nb: lv.nb,
            src_nb: ls.nb,
        };
        Ok(self.computed(op, Layout::contiguous(F32, ls.ne), vec![dy]))
    }
}
