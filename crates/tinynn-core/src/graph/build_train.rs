//! Builders for training: the loss and the optimizer steps (which update persistent tensors
//! in place).

use tinynn_format::GgmlType;

use super::{err, Graph, Mem, Result};
use crate::ops::Op;
use crate::tensor::{Layout, TensorId};

const F32: GgmlType = GgmlType::F32;

impl Graph {
    /// Mean over tokens of `-log softmax(logits)[label]`; logits `[V, n]`, labels I32 `[n]`,
    /// negative labels masked out (the mean is over the rest; 0 when none is left).
    pub fn cross_entropy_loss(&mut self, logits: TensorId, labels: TensorId) -> Result<TensorId> {
        const OP: &str = "cross_entropy_loss";
        let ll = self.f32_rows(OP, logits)?;
        self.check_id(OP, labels)?;
        let lb = *self.layout(labels);
        if lb.dtype != GgmlType::I32
            || lb.ne != [ll.ne[1] * ll.ne[2] * ll.ne[3], 1, 1, 1]
            || !lb.is_contiguous()
        {
            return err(
                OP,
                format!(
                    "labels must be contiguous I32 [{}], got {} {:?}",
                    ll.n_rows(),
                    lb.dtype,
                    lb.ne
                ),
            );
        }
        Ok(self.computed(
            Op::CrossEntropyLoss,
            Layout::contiguous(F32, [1, 1, 1, 1]),
            vec![logits, labels],
        ))
    }

    /// `Σ -log softmax(logits)[label] / norm[0]` over the scored tokens (negative labels
    /// masked out), `norm` F32 `[1]`: the share of one chunk of tokens in the mean over a
    /// larger batch whose scored-token count is `norm` (so chunks add up to that mean).
    pub fn cross_entropy_loss_normalized(
        &mut self,
        logits: TensorId,
        labels: TensorId,
        norm: TensorId,
    ) -> Result<TensorId> {
        let ln = self.f32_operand("cross_entropy_loss", norm)?;
        if ln.n_elements() != 1 || !ln.is_contiguous() {
            return err("cross_entropy_loss", "the divisor must be F32 [1]");
        }
        let loss = self.cross_entropy_loss(logits, labels)?;
        self.nodes[loss.index()].src.push(norm);
        Ok(loss)
    }

    /// `buf += x` in place, `buf` a persistent F32 tensor (a gradient accumulation buffer) and
    /// `x` F32 of its shape: one pass over both, no arena result and no copy back.
    pub fn accumulate_into(&mut self, buf: TensorId, x: TensorId) -> Result<TensorId> {
        const OP: &str = "accumulate_into";
        let (lb, lx) = (self.f32_operand(OP, buf)?, self.f32_operand(OP, x)?);
        if !lb.is_contiguous() || lb.ne != lx.ne || !self.is_persistent(buf) {
            return err(
                OP,
                format!(
                    "needs a contiguous persistent F32 buffer and a value of its shape, got {:?} and {:?}",
                    lb.ne, lx.ne
                ),
            );
        }
        Ok(self.in_place(Op::Binary(crate::ops::Binary::Add), buf, vec![buf, x]))
    }

    /// Makes computed arena tensor `t` write its result straight into persistent tensor `buf`
    /// (same F32 shape, contiguous), so that a gradient lands in its buffer without a copy.
    /// Returns false, changing nothing, when `t` is not such a tensor (a view, a leaf, an op
    /// already writing in place, another shape); the caller then copies or accumulates.
    pub fn compute_into(&mut self, t: TensorId, buf: TensorId) -> Result<bool> {
        self.check_id("compute_into", t)?;
        self.check_id("compute_into", buf)?;
        let (n, lb) = (self.node(t), *self.layout(buf));
        let fits = n.mem == Mem::Arena
            && n.op.computes()
            && n.layout.dtype == GgmlType::F32
            && n.layout.is_contiguous()
            && n.layout.ne == lb.ne
            && lb.dtype == GgmlType::F32
            && lb.is_contiguous()
            && self.node(buf).mem == Mem::Persistent
            && !n.src.contains(&buf)
            // Nothing may already alias t's memory (a view or in-place op would move too).
            && !self.nodes.iter().any(|m| matches!(m.mem, Mem::Alias { base, .. } if base == t));
        if fits {
            self.nodes[t.index()].mem = Mem::Alias {
                base: buf,
                offset: 0,
            };
        }
        Ok(fits)
    }

    fn optimizer_operands(
        &self,
        op: &'static str,
        param: TensorId,
        state: &[TensorId],
        hp: TensorId,
        n_hp: usize,
    ) -> Result<()> {
        let lp = self.f32_operand(op, param)?;
        if !lp.is_contiguous() || self.node(self.root(param).0).mem != Mem::Persistent {
            return err(
                op,
                "the parameter must be a contiguous persistent F32 tensor",
            );
        }
        for &t in state {
            let l = self.f32_operand(op, t)?;
            if l.ne != lp.ne || !l.is_contiguous() {
                return err(
                    op,
                    format!(
                        "gradient and state must be contiguous like the parameter {:?}, got {:?}",
                        lp.ne, l.ne
                    ),
                );
            }
        }
        let lh = self.f32_operand(op, hp)?;
        // One more value, optional: a factor the gradient is multiplied by (clipping).
        if lh.ne != [n_hp, 1, 1, 1] && lh.ne != [n_hp + 1, 1, 1, 1] {
            return err(
                op,
                format!("hyperparameters must be F32 [{n_hp}] or [{}]", n_hp + 1),
            );
        }
        Ok(())
    }

    fn in_place(&mut self, op: Op, param: TensorId, src: Vec<TensorId>) -> TensorId {
        let layout = *self.layout(param);
        let id = self.computed(op, layout, src);
        self.nodes[id.index()].mem = Mem::Alias {
            base: param,
            offset: 0,
        };
        id
    }

    /// One AdamW step on `param` (persistent) with `grad`, moments `m`, `v` (persistent) and
    /// hyperparameters `hp` F32 `[7]`: `[lr, beta1, beta2, eps, weight_decay, 1/(1-beta1^t),
    /// 1/(1-beta2^t)]`, read at run time so schedules need no rebuild; an 8th value, if
    /// present, multiplies the gradient first (the clipping factor, with no pass of its own).
    pub fn adamw_step(
        &mut self,
        param: TensorId,
        grad: TensorId,
        m: TensorId,
        v: TensorId,
        hp: TensorId,
    ) -> Result<TensorId> {
        self.optimizer_operands("adamw", param, &[grad, m, v], hp, 7)?;
        for t in [m, v] {
            if self.node(self.root(t).0).mem != Mem::Persistent {
                return err("adamw", "moments must be persistent");
            }
        }
        Ok(self.in_place(Op::AdamW, param, vec![param, grad, m, v, hp]))
    }

    /// One SGD step with momentum: `vel = momentum·vel + grad; param = param·(1 − lr·wd) − lr·vel`,
    /// hyperparameters `hp` F32 `[3]`: `[lr, momentum, weight_decay]`, and optionally a 4th that
    /// multiplies the gradient first.
    pub fn sgd_step(
        &mut self,
        param: TensorId,
        grad: TensorId,
        velocity: TensorId,
        hp: TensorId,
    ) -> Result<TensorId> {
        self.optimizer_operands("sgd", param, &[grad, velocity], hp, 3)?;
        if self.node(self.root(velocity).0).mem != Mem::Persistent {
            return err("sgd", "the velocity must be persistent");
        }
        Ok(self.in_place(Op::Sgd, param, vec![param, grad, velocity, hp]))
    }
}
