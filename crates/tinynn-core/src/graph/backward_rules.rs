//! One backward rule per op, in one exhaustive `match`. A rule gets the node, the gradient `dy`
//! of its output (F32, contiguous, the output's shape) and which sources need a gradient, and
//! returns one contribution per source, shaped like that source. Ops whose outputs are integers
//! contribute nothing; ops without a rule return a typed error when a gradient must flow
//! through them.

use tinynn_format::GgmlType;

use super::backward::Contributions;
use super::{err, Graph, Mem, Result};
use crate::ops::{Binary, Op, Unary};
use crate::tensor::{Layout, TensorId, MAX_DIMS};

impl Graph {
    /// `dy` summed onto `target`'s shape when it was broadcast, else `dy` itself.
    fn unbroadcast(&mut self, dy: TensorId, target: TensorId) -> Result<TensorId> {
        let ne = self.layout(target).ne;
        if self.layout(dy).ne == ne {
            Ok(dy)
        } else {
            self.reduce_to(dy, &ne)
        }
    }

    /// `d` `[a, b, c2, c3]` summed onto `target`'s batch dims `[a, b, b2, b3]`, where batch i2
    /// used target batch `i2 / (c2 / b2)` (mul_mat's and out_prod's blocked broadcasting).
    fn reduce_batches(&mut self, d: TensorId, target: TensorId) -> Result<TensorId> {
        let (ld, lt) = (self.layout(d).ne, self.layout(target).ne);
        if ld == lt {
            return Ok(d);
        }
        let ab = ld[0] * ld[1];
        let (c2, b2, b3) = (ld[2], lt[2], lt[3]);
        let (r2, r3) = (c2 / b2, ld[3] / b3);
        let mut t = d;
        if r3 > 1 {
            t = self.reshape(t, &[ab * c2, r3, b3])?;
            t = self.reduce_to(t, &[ab * c2, 1, b3])?;
        }
        if r2 > 1 {
            t = self.reshape(t, &[ab, r2, b2, b3])?;
            t = self.reduce_to(t, &[ab, 1, b2, b3])?;
        }
        self.reshape(t, &lt)
    }

    pub(super) fn backward_rule(
        &mut self,
        id: TensorId,
        dy: TensorId,
        needs: &[bool],
    ) -> Result<Contributions> {
        let node = self.node(id).clone();
        let src = node.src.clone();
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        let no_rule = |why: &str| {
            err(
                "backward",
                format!(
                    "{} ('{}') is not differentiable{why}",
                    node.op.name(),
                    node.name
                ),
            )
        };
        let mut out: Contributions = vec![None; src.len()];
        match node.op {
            // Leaves are where gradients stop.
            Op::Leaf => {}
            Op::View => out[0] = Some(self.view_grad(id, dy)?),
            Op::MulMat => {
                // y [N, M, c2, c3] = W [K, N, b2, b3] · x [K, M, c2, c3]
                let (w, x) = (src[0], src[1]);
                if need(0) {
                    if self.layout(w).dtype != GgmlType::F32 {
                        return no_rule(" for quantized weights (freeze them)");
                    }
                    // dW [K, N] = Σ_m x[k, m] dy[n, m], summed over broadcast batches.
                    let dw = self.out_prod(x, dy)?;
                    out[0] = Some(self.reduce_batches(dw, w)?);
                }
                if need(1) {
                    out[1] = Some(self.mul_mat_t(w, dy)?); // dx [K, M] = Wᵀ·dy
                }
            }
            Op::Unary(u) => out[0] = Some(self.unary_back(u, src[0], dy)?),
            Op::Binary(b) => {
                let (a, c) = (src[0], src[1]);
                match b {
                    Binary::Add | Binary::Sub => {
                        if need(0) {
                            out[0] = Some(dy);
                        }
                        if need(1) {
                            let d = if b == Binary::Sub {
                                self.scale(dy, -1.0)?
                            } else {
                                dy
                            };
                            out[1] = Some(self.unbroadcast(d, c)?);
                        }
                    }
                    Binary::Mul => {
                        if need(0) {
                            out[0] = Some(self.mul(dy, c)?);
                        }
                        if need(1) {
                            let d = self.mul(dy, a)?;
                            out[1] = Some(self.unbroadcast(d, c)?);
                        }
                    }
                    Binary::Div => {
                        let da = self.div(dy, c)?; // dy / c
                        if need(1) {
                            // -dy·a/c² = -(dy/c)·(a/c)
                            let q = self.div(a, c)?;
                            let d = self.mul(da, q)?;
                            let d = self.scale(d, -1.0)?;
                            out[1] = Some(self.unbroadcast(d, c)?);
                        }
                        if need(0) {
                            out[0] = Some(da);
                        }
                    }
                }
            }
            Op::Scale(s) => out[0] = Some(self.scale(dy, s)?),
            // Diagonal and linear: the same mask scales the gradient.
            Op::Dropout { p, salt } => out[0] = Some(self.dropout(dy, src[1], p, salt)?),
            Op::SwiGlu | Op::GeGlu => {
                // y = act(g)·u: dg = dy·u·act'(g), du = dy·act(g)
                let act = if node.op == Op::SwiGlu {
                    Unary::Silu
                } else {
                    Unary::GeluTanh
                };
                let (g, u) = (src[0], src[1]);
                let contiguous = [g, u, dy].iter().all(|&t| self.layout(t).is_contiguous());
                if node.op == Op::SwiGlu && contiguous {
                    // One pass for both (the gate's sigmoid once, no intermediates).
                    let flat = self.swiglu_back(g, u, dy)?;
                    let ne = self.layout(g).ne;
                    let nb = Layout::contiguous(GgmlType::F32, ne).nb;
                    let bytes = self.layout(g).n_elements() * 4;
                    for (i, offset) in [(0, 0), (1, bytes)] {
                        if need(i) {
                            out[i] = Some(self.view(flat, &ne, &nb[1..], offset)?);
                        }
                    }
                    return Ok(out);
                }
                if need(0) {
                    let t = self.mul(dy, u)?;
                    out[0] = Some(self.unary_back(act, g, t)?);
                }
                if need(1) {
                    let a = self.unary(act, g)?;
                    out[1] = Some(self.mul(dy, a)?);
                }
            }
            Op::RmsNorm { eps } => out[0] = Some(self.rms_norm_back(src[0], dy, eps)?),
            Op::LayerNorm {
                eps,
                has_weight,
                has_bias,
            } => {
                let x = src[0];
                let w = has_weight.then(|| src[1]);
                let wi = 1;
                let bi = if has_weight { 2 } else { 1 };
                if has_weight && need(wi) {
                    let xhat = self.layer_norm(x, eps, None, None)?;
                    let d = self.mul(dy, xhat)?;
                    out[wi] = Some(self.unbroadcast(d, src[wi])?);
                }
                if has_bias && need(bi) {
                    out[bi] = Some(self.unbroadcast(dy, src[bi])?);
                }
                if need(0) {
                    let dxhat = match w {
                        Some(w) => self.mul(dy, w)?,
                        None => dy,
                    };
                    out[0] = Some(self.layer_norm_back(x, dxhat, eps)?);
                }
            }
            Op::SoftMax {
                scale,
                max_bias,
                has_mask,
            } => {
                // z = x·scale + slope·mask; y = softmax(z)
                if need(0) {
                    out[0] = Some(self.soft_max_back(id, dy, scale)?);
                }
                if has_mask && need(1) {
                    if max_bias > 0.0 {
                        return no_rule(" for an ALiBi mask");
                    }
                    let dz = self.soft_max_back(id, dy, 1.0)?;
                    let m = src[1];
                    if self.layout(m).ne[1] != self.layout(id).ne[1] {
                        return no_rule(" for a mask with more rows than the scores");
                    }
                    out[1] = Some(self.unbroadcast(dz, m)?);
                }
            }
            Op::DiagMaskInf { n_past } => out[0] = Some(self.diag_mask_zero(dy, n_past)?),
            Op::Rope {
                rope,
                has_freq_factors,
            } => {
                if has_freq_factors && need(2) {
                    return no_rule(" for its frequency factors");
                }
                let ff = has_freq_factors.then(|| src[2]);
                out[0] = Some(self.rope_back(dy, src[1], ff, rope)?);
            }
            Op::FlashAttn {
                scale,
                softcap,
                has_mask,
                has_kv_len,
            } => {
                if has_kv_len {
                    return no_rule(
                        " with a run-time kv length (build training graphs without the KV cache)",
                    );
                }
                if has_mask && need(3) {
                    return no_rule(" for its mask");
                }
                let (q, k, v) = (src[0], src[1], src[2]);
                let mask = has_mask.then(|| src[3]);
                let flat = self.flash_attn_back(q, k, v, mask, dy, scale, softcap)?;
                let mut offset = 0;
                for (i, t) in [q, k, v].into_iter().enumerate() {
                    let ne = self.layout(t).ne;
                    let nb = Layout::contiguous(GgmlType::F32, ne).nb;
                    let part = self.view(flat, &ne, &nb[1..], offset)?;
                    offset += self.layout(t).n_elements() * 4;
                    if need(i) {
                        out[i] = Some(part);
                    }
                }
            }
            Op::GetRows => {
                if need(0) {
                    let rows = self.layout(src[0]).ne[1];
                    out[0] = Some(self.get_rows_back(dy, src[1], rows)?);
                }
            }
            Op::Cpy => {
                // The result is dst overwritten with src: only src gets a gradient.
                if need(0) {
                    let ne = self.layout(src[0]).ne;
                    out[0] = Some(self.reshape(dy, &ne)?);
                }
            }
            Op::Cont => out[0] = Some(dy),
            Op::Concat { dim } => {
                let l = *self.layout(dy);
                let mut offset = 0;
                for (i, &s) in src.iter().enumerate() {
                    let ne = self.layout(s).ne;
                    if need(i) {
                        let part = self.view(dy, &ne, &l.nb[1..], offset)?;
                        out[i] = Some(self.cont(part)?);
                    }
                    offset += ne[dim] * l.nb[dim];
                }
            }
            Op::Sum | Op::SumRows => {
                let ne = self.layout(src[0]).ne;
                out[0] = Some(self.repeat(dy, &ne)?);
            }
            // d Σx² = 2x·dy (dy [1] broadcasts).
            Op::SumSq => {
                let d = self.mul(src[0], dy)?;
                out[0] = Some(self.scale(d, 2.0)?);
            }
            Op::Mean => {
                let ne = self.layout(src[0]).ne;
                let r = self.repeat(dy, &ne)?;
                out[0] = Some(self.scale(r, 1.0 / ne[0] as f32)?);
            }
            // Integer outputs carry no gradient.
            Op::Argmax | Op::Argsort { .. } | Op::TopK { .. } => {}
            Op::OutProd => {
                // y [m, p] = Σ_k a[i, k]·b[j, k] with a [m, n], b [p, n]
                let (a, b) = (src[0], src[1]);
                if need(0) {
                    let bt = self.transpose(b)?; // [n, p]
                    let d = self.out_prod(dy, bt)?; // Σ_j dy[i, j]·b[j, k] → [m, n]
                    out[0] = Some(self.reduce_batches(d, a)?);
                }
                if need(1) {
                    if self.layout(a).ne[2..] != self.layout(b).ne[2..] {
                        return no_rule(" for its second operand when the first is broadcast");
                    }
                    let dyc = self.cont(dy)?; // [m, p]
                    out[1] = Some(self.mul_mat(dyc, a)?); // Σ_i dy[i, j]·a[i, k] → [p, n]
                }
            }
            Op::ReduceTo => {
                let ne = self.layout(src[0]).ne;
                out[0] = Some(self.repeat(dy, &ne)?);
            }
            Op::Repeat => out[0] = Some(self.unbroadcast(dy, src[0])?),
            Op::CrossEntropyLoss => {
                out[0] = Some(match src.get(2) {
                    Some(&norm) => {
                        self.cross_entropy_loss_normalized_back(src[0], src[1], norm, dy)?
                    }
                    None => self.cross_entropy_loss_back(src[0], src[1], dy)?,
                });
            }
            Op::SetRows => return no_rule(" (cache writes are not part of training graphs)"),
            Op::MulMatId => {
                // y[:, e, t] = W[ids[e, t]] · x[:, e mod b1, t]
                let (w, x, ids) = (src[0], src[1], src[2]);
                let dyc = self.cont(dy)?;
                if need(0) {
                    if self.layout(w).dtype != GgmlType::F32 {
                        return no_rule(" for quantized experts (freeze them)");
                    }
                    let n_expert = self.layout(w).ne[2];
                    out[0] = Some(self.out_prod_id(x, dyc, ids, n_expert)?);
                }
                if need(1) {
                    let dx = self.mul_mat_id_t(w, dyc, ids)?; // [K, n_used, n]
                    out[1] = Some(self.unbroadcast(dx, x)?);
                }
            }
            Op::TakeRows => {
                if need(0) {
                    let n_rows = self.layout(src[0]).ne[0];
                    let dyc = self.cont(dy)?;
                    out[0] = Some(self.take_rows_back(dyc, src[1], n_rows)?);
                }
            }
            Op::AddId => return no_rule(" yet (per-expert biases)"),
            Op::SsmConv => {
                let (sx, c) = (src[0], src[1]);
                let flat = self.ssm_conv_back(sx, c, dy)?;
                let mut offset = 0;
                for (i, t) in [sx, c].into_iter().enumerate() {
                    let ne = self.layout(t).ne;
                    let nb = Layout::contiguous(GgmlType::F32, ne).nb;
                    let part = self.view(flat, &ne, &nb[1..], offset)?;
                    offset += self.layout(t).n_elements() * 4;
                    if need(i) {
                        out[i] = Some(part);
                    }
                }
            }
            Op::SsmScan => {
                let [s, x, dt, a, b, c] = [src[0], src[1], src[2], src[3], src[4], src[5]];
                let flat = self.ssm_scan_back(s, x, dt, a, b, c, dy)?;
                let n_s = self.layout(s).ne[2];
                let mut offset = 0;
                for (i, t) in [s, x, dt, a, b, c].into_iter().enumerate() {
                    // A's gradient comes per sequence: [d_state, d_inner, n_s], then summed.
                    let mut ne = self.layout(t).ne;
                    if i == 3 {
                        ne[2] = n_s;
                    }
                    let nb = Layout::contiguous(GgmlType::F32, ne).nb;
                    let part = self.view(flat, &ne, &nb[1..], offset)?;
                    offset += ne.iter().product::<usize>() * 4;
                    if need(i) {
                        out[i] = Some(if i == 3 {
                            let p = self.cont(part)?;
                            self.reduce_to(p, &self.layout(t).ne.clone())?
                        } else {
                            part
                        });
                    }
                }
            }
            Op::Im2Col { .. } => return no_rule(" yet (convolution)"),
            Op::AdamW | Op::Sgd => return no_rule(" (an optimizer step)"),
            Op::Fill(_) => {}
            Op::UnaryBack(_)
            | Op::RmsNormBack { .. }
            | Op::LayerNormBack { .. }
            | Op::SoftMaxBack { .. }
            | Op::DiagMaskZero { .. }
            | Op::RopeBack { .. }
            | Op::FlashAttnBack { .. }
            | Op::GetRowsBack
            | Op::CrossEntropyLossBack
            | Op::SwiGluBack
            | Op::MulMatT
            | Op::TakeRowsBack
            | Op::MulMatIdT
            | Op::OutProdId
            | Op::SsmConvBack
            | Op::SsmScanBack
            | Op::ViewBack { .. } => return no_rule(" (second derivatives are not supported)"),
        }
        Ok(out)
    }

    /// The gradient of view `v` (of tensor s) for its source: a reshape of `dy` when v is a
    /// reshape, a permuted copy when v is a permutation, else `view_back` (scatter into zeros).
    fn view_grad(&mut self, v: TensorId, dy: TensorId) -> Result<TensorId> {
        let node = self.node(v).clone();
        let Mem::Alias { base: s, offset } = node.mem else {
            return err("backward", "a view without a base");
        };
        let (lv, ls) = (node.layout, *self.layout(s));
        if offset == 0 && lv.n_elements() == ls.n_elements() {
            if lv.is_contiguous() && ls.is_contiguous() {
                return self.reshape(dy, &ls.ne);
            }
            if let Some(axes) = inverse_permutation(&lv, &ls) {
                let p = self.permute(dy, axes)?;
                return self.cont(p);
            }
        }
        self.view_back(dy, v)
    }
}

/// When view layout `lv` is a permutation of `ls`'s dimensions (same memory, offset 0): the
/// axes that permute a tensor shaped like `lv` back to `ls`'s shape.
fn inverse_permutation(lv: &Layout, ls: &Layout) -> Option<[usize; MAX_DIMS]> {
    let mut axes = [usize::MAX; MAX_DIMS];
    let mut taken = [false; MAX_DIMS];
    for (axis, (&ne, &nb)) in axes.iter_mut().zip(lv.ne.iter().zip(&lv.nb)) {
        if ne == 1 {
            continue;
        }
        let e = (0..MAX_DIMS).find(|&e| !taken[e] && ls.ne[e] == ne && ls.nb[e] == nb)?;
        *axis = e;
        taken[e] = true;
    }
    // Size-1 dimensions fill the remaining positions (any order gives the same memory).
    for axis in axes.iter_mut().filter(|a| **a == usize::MAX) {
        let e = (0..MAX_DIMS).find(|&e| !taken[e] && ls.ne[e] == 1)?;
        *axis = e;
        taken[e] = true;
    }
    Some(axes)
}
