//! Builders for the less common ops: outer products, mixture-of-experts, Mamba's convolution
//! and scan, im2col and 2-D convolution.

use tinynn_format::GgmlType;

use super::{err, Graph, Result};
use crate::ops::Op;
use crate::tensor::{Layout, TensorId};

const F32: GgmlType = GgmlType::F32;

impl Graph {
    /// `a [m, n, a2, a3] ⊗ b [p, n, b2, b3] → [m, p, b2, b3]` (b2, b3 multiples of a2, a3).
    pub fn out_prod(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        const OP: &str = "out_prod";
        let la = self.f32_operand(OP, a)?;
        let lb = self.f32_operand(OP, b)?;
        if la.ne[1] != lb.ne[1] || lb.ne[2] % la.ne[2] != 0 || lb.ne[3] % la.ne[3] != 0 {
            return err(
                OP,
                format!(
                    "{:?} and {:?} do not share their second dimension",
                    la.ne, lb.ne
                ),
            );
        }
        let layout = Layout::contiguous(F32, [la.ne[0], lb.ne[0], lb.ne[2], lb.ne[3]]);
        Ok(self.computed(Op::OutProd, layout, vec![a, b]))
    }

    pub(super) fn ids_operand(
        &self,
        op: &'static str,
        ids: TensorId,
        n_used: usize,
        n_tokens: usize,
    ) -> Result<()> {
        self.check_id(op, ids)?;
        let li = *self.layout(ids);
        if li.dtype != GgmlType::I32 || li.ne != [n_used, n_tokens, 1, 1] || !li.is_contiguous() {
            return err(
                op,
                format!(
                    "ids must be contiguous I32 [{n_used}, {n_tokens}], got {} {:?}",
                    li.dtype, li.ne
                ),
            );
        }
        Ok(())
    }

    /// Mixture of experts: experts `[K, N, n_expert]` (any weight type), activations
    /// `[K, 1 or n_used, n_tokens]`, I32 ids `[n_used, n_tokens]` → `[N, n_used, n_tokens]`.
    pub fn mul_mat_id(
        &mut self,
        experts: TensorId,
        b: TensorId,
        ids: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "mul_mat_id";
        self.check_id(OP, experts)?;
        let le = *self.layout(experts);
        let lb = self.f32_operand(OP, b)?;
        if crate::quant::vec_dot_type(le.dtype).is_err() || !le.rows_contiguous() || le.ne[3] != 1 {
            return err(
                OP,
                format!(
                    "experts must be [K, N, n_expert] of a supported type, got {} {:?}",
                    le.dtype, le.ne
                ),
            );
        }
        self.check_id(OP, ids)?;
        let n_used = self.layout(ids).ne[0];
        if lb.ne[0] != le.ne[0] || lb.ne[3] != 1 || (lb.ne[1] != 1 && lb.ne[1] != n_used) {
            return err(
                OP,
                format!("activations {:?} do not fit experts {:?}", lb.ne, le.ne),
            );
        }
        self.ids_operand(OP, ids, n_used, lb.ne[2])?;
        let layout = Layout::contiguous(F32, [le.ne[1], n_used, lb.ne[2], 1]);
        Ok(self.computed(Op::MulMatId, layout, vec![experts, b, ids]))
    }

    /// `a [n, n_used, n_tokens] + b[:, ids[e, t]]` with b `[n, n_expert]`.
    pub fn add_id(&mut self, a: TensorId, b: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "add_id";
        let la = self.f32_operand(OP, a)?;
        let lb = self.f32_rows(OP, b)?;
        if lb.ne[0] != la.ne[0] || lb.ne[2] * lb.ne[3] != 1 || la.ne[3] != 1 {
            return err(OP, format!("biases {:?} do not fit {:?}", lb.ne, la.ne));
        }
        self.ids_operand(OP, ids, la.ne[1], la.ne[2])?;
        Ok(self.computed(Op::AddId, Layout::contiguous(F32, la.ne), vec![a, b, ids]))
    }

    /// Mamba's convolution: `sx [d_conv - 1 + n_t, d_inner, n_s]`, weights `[d_conv, d_inner]`
    /// → `[d_inner, n_t, n_s]`.
    pub fn ssm_conv(&mut self, sx: TensorId, c: TensorId) -> Result<TensorId> {
        const OP: &str = "ssm_conv";
        let ls = self.f32_operand(OP, sx)?;
        let lc = self.f32_operand(OP, c)?;
        let d_conv = lc.ne[0];
        if lc.ne[1] != ls.ne[1] || ls.ne[0] < d_conv || ls.ne[3] != 1 || lc.ne[2] * lc.ne[3] != 1 {
            return err(
                OP,
                format!("input {:?} does not fit weights {:?}", ls.ne, lc.ne),
            );
        }
        let n_t = ls.ne[0] - (d_conv - 1);
        Ok(self.computed(
            Op::SsmConv,
            Layout::contiguous(F32, [ls.ne[1], n_t, ls.ne[2], 1]),
            vec![sx, c],
        ))
    }

    /// Mamba's selective scan. Shapes: state `[d_state, d_inner, n_s]`, x and dt
    /// `[d_inner, n_t, n_s]`, A `[d_state, d_inner]`, B and C `[d_state, n_t, n_s]`. The result
    /// is flat: the outputs `[d_inner, n_t, n_s]` then the final states (view them apart).
    #[allow(clippy::too_many_arguments)]
    pub fn ssm_scan(
        &mut self,
        s: TensorId,
        x: TensorId,
        dt: TensorId,
        a: TensorId,
        b: TensorId,
        c: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "ssm_scan";
        let ls = self.f32_operand(OP, s)?;
        let lx = self.f32_operand(OP, x)?;
        let ld = self.f32_operand(OP, dt)?;
        let la = self.f32_operand(OP, a)?;
        let lb = self.f32_operand(OP, b)?;
        let lc = self.f32_operand(OP, c)?;
        let (d_state, d_inner, n_t, n_s) = (ls.ne[0], ls.ne[1], lx.ne[1], ls.ne[2]);
        let ok = lx.ne == [d_inner, n_t, n_s, 1]
            && ld.ne == lx.ne
            && la.ne == [d_state, d_inner, 1, 1]
            && lb.ne == [d_state, n_t, n_s, 1]
            && lc.ne == lb.ne
            && ls.ne[3] == 1;
        if !ok {
            return err(
                OP,
                format!(
                    "shapes do not fit: s {:?} x {:?} dt {:?} A {:?} B {:?} C {:?}",
                    ls.ne, lx.ne, ld.ne, la.ne, lb.ne, lc.ne
                ),
            );
        }
        let n = d_inner * n_t * n_s + d_state * d_inner * n_s;
        Ok(self.computed(
            Op::SsmScan,
            Layout::contiguous(F32, [n, 1, 1, 1]),
            vec![s, x, dt, a, b, c],
        ))
    }

    /// Gradient of [`Graph::ssm_conv`] of `sx` and `c` for output gradient `dy`: flat, the
    /// input's gradient (`sx`'s shape) then the weights' (`c`'s).
    pub fn ssm_conv_back(&mut self, sx: TensorId, c: TensorId, dy: TensorId) -> Result<TensorId> {
        const OP: &str = "ssm_conv_back";
        let ls = self.f32_operand(OP, sx)?;
        let lc = self.f32_operand(OP, c)?;
        let ld = self.f32_operand(OP, dy)?;
        let n_t = ls.ne[0].saturating_sub(lc.ne[0] - 1);
        if ld.ne != [ls.ne[1], n_t, ls.ne[2], 1] || lc.ne[1] != ls.ne[1] {
            return err(
                OP,
                format!(
                    "dy {:?} does not fit input {:?} and weights {:?}",
                    ld.ne, ls.ne, lc.ne
                ),
            );
        }
        let n = ls.n_elements() + lc.n_elements();
        Ok(self.computed(
            Op::SsmConvBack,
            Layout::contiguous(F32, [n, 1, 1, 1]),
            vec![sx, c, dy],
        ))
    }

    /// Gradient of [`Graph::ssm_scan`] for `dy` (flat, as its result): flat, the gradients of
    /// the initial state, x, dt, A per sequence, B and C (see `Op::SsmScanBack`).
    #[allow(clippy::too_many_arguments)]
    pub fn ssm_scan_back(
        &mut self,
        s: TensorId,
        x: TensorId,
        dt: TensorId,
        a: TensorId,
        b: TensorId,
        c: TensorId,
        dy: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "ssm_scan_back";
        // The forward's checks hold the shapes together; build it to re-run them.
        let fwd_len = {
            let ls = self.f32_operand(OP, s)?;
            let lx = self.f32_operand(OP, x)?;
            ls.n_elements() + lx.n_elements()
        };
        for t in [dt, a, b, c] {
            self.f32_operand(OP, t)?;
        }
        let ld = self.f32_operand(OP, dy)?;
        if ld.n_elements() != fwd_len || !ld.is_contiguous() {
            return err(OP, format!("dy {:?} is not the scan's flat result", ld.ne));
        }
        let (ls, lx, lb) = (*self.layout(s), *self.layout(x), *self.layout(b));
        let (d_state, d_inner, n_s) = (ls.ne[0], ls.ne[1], ls.ne[2]);
        let n_t = lx.ne[1];
        let ok = lx.ne == [d_inner, n_t, n_s, 1]
            && self.layout(dt).ne == lx.ne
            && self.layout(a).ne == [d_state, d_inner, 1, 1]
            && lb.ne == [d_state, n_t, n_s, 1]
            && self.layout(c).ne == lb.ne;
        if !ok {
            return err(OP, "shapes do not fit the scan's");
        }
        let n = 2 * ls.n_elements() + 2 * lx.n_elements() + 2 * lb.n_elements();
        Ok(self.computed(
            Op::SsmScanBack,
            Layout::contiguous(F32, [n, 1, 1, 1]),
            vec![s, x, dt, a, b, c, dy],
        ))
    }

    /// Patches of `input` `[IW, IH, IC, N]` for a kernel `[KW, KH, IC, OC]` as columns
    /// `[IC·KH·KW, OW, OH, N]` (F32).
    pub fn im2col(
        &mut self,
        kernel: TensorId,
        input: TensorId,
        stride: [usize; 2],
        pad: [usize; 2],
        dilation: [usize; 2],
    ) -> Result<TensorId> {
        const OP: &str = "im2col";
        self.check_id(OP, kernel)?;
        let lk = *self.layout(kernel);
        let li = self.f32_operand(OP, input)?;
        if lk.ne[2] != li.ne[2] {
            return err(
                OP,
                format!(
                    "kernel {:?} and input {:?} differ in channels",
                    lk.ne, li.ne
                ),
            );
        }
        if stride.contains(&0) || dilation.contains(&0) {
            return err(OP, "stride and dilation must be at least 1");
        }
        let out = |i: usize| {
            let span = dilation[i] * (lk.ne[i] - 1) + 1;
            (li.ne[i] + 2 * pad[i])
                .checked_sub(span)
                .map(|n| n / stride[i] + 1)
        };
        let (Some(ow), Some(oh)) = (out(0), out(1)) else {
            return err(
                OP,
                format!(
                    "kernel {:?} does not fit input {:?} with padding {pad:?}",
                    lk.ne, li.ne
                ),
            );
        };
        let layout = Layout::contiguous(F32, [li.ne[2] * lk.ne[1] * lk.ne[0], ow, oh, li.ne[3]]);
        let op = Op::Im2Col {
            stride,
            pad,
            dilation,
        };
        Ok(self.computed(op, layout, vec![kernel, input]))
    }

    /// 2-D convolution: kernel `[KW, KH, IC, OC]` (F32/F16, contiguous), input `[IW, IH, IC, N]`
    /// → `[OW, OH, OC, N]`, as im2col then mul_mat.
    pub fn conv_2d(
        &mut self,
        kernel: TensorId,
        input: TensorId,
        stride: [usize; 2],
        pad: [usize; 2],
        dilation: [usize; 2],
    ) -> Result<TensorId> {
        let cols = self.im2col(kernel, input, stride, pad, dilation)?;
        let lk = *self.layout(kernel);
        let lc = *self.layout(cols);
        let (k, oc) = (lk.ne[0] * lk.ne[1] * lk.ne[2], lk.ne[3]);
        let w = self.reshape(kernel, &[k, oc])?;
        let c = self.reshape(cols, &[k, lc.ne[1] * lc.ne[2] * lc.ne[3]])?;
        let y = self.mul_mat(w, c)?; // [OC, OW·OH·N]
        let y = self.reshape(y, &[oc, lc.ne[1], lc.ne[2], lc.ne[3]])?;
        let y = self.permute(y, [2, 0, 1, 3])?; // → [OW, OH, OC, N]
        self.cont(y)
    }
}
