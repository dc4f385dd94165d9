//! Reverse-mode autograd on the graph: `backward` appends gradient nodes to the same graph, so
//! forward, backward and the optimizer update compile into one plan.
//!
//! Every gradient is an F32 tensor shaped like the tensor it belongs to, contiguous. A tensor
//! read by several consumers gets the sum of their contributions (added in the reverse order of
//! the consumers, so the result does not depend on threads). The rules, one per op, are in
//! `backward_rules.rs`.

use tinynn_format::GgmlType;

use super::{err, Graph, Mem, Node, Result};
use crate::ops::Op;
use crate::tensor::TensorId;

/// What one rule returns: a gradient contribution per source (`None` where the source needs
/// none or gets none).
pub type Contributions = Vec<Option<TensorId>>;

/// A replacement for the rule of some nodes, for tests that prove the gradient checker catches
/// a wrong rule. Returns `None` to use the real rule.
pub type RuleOverride<'a> =
    &'a dyn Fn(&mut Graph, TensorId, TensorId, &[bool]) -> Option<Result<Contributions>>;

/// Where parameter gradients go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GradMode {
    /// Gradients are arena tensors of this step only.
    Fresh,
    /// Each parameter has a persistent gradient buffer (zero at first) that every run adds this
    /// step's gradient into (micro-batch accumulation); `Memory::zero_persistent` resets it.
    Accumulate,
}

/// The gradients `backward` built, in the order of the parameters given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gradients {
    pub params: Vec<TensorId>,
    /// The gradient of each parameter as the optimizer should read it (for `Accumulate`, the
    /// persistent buffer after this step's gradient was added).
    pub grads: Vec<TensorId>,
    /// `Accumulate` only: the persistent buffers themselves (to zero between optimizer steps).
    pub buffers: Vec<TensorId>,
}

impl Graph {
    /// Appends the gradient of scalar `loss` with respect to each of `params` (F32 leaves) and
    /// returns them, in order. A parameter the loss does not depend on gets zeros.
    pub fn backward(&mut self, loss: TensorId, params: &[TensorId]) -> Result<Vec<TensorId>> {
        self.backward_with(loss, params, 1.0, None)
    }

    /// [`Graph::backward`] with the gradients placed as `mode` says.
    pub fn backward_mode(
        &mut self,
        loss: TensorId,
        params: &[TensorId],
        mode: GradMode,
    ) -> Result<Gradients> {
        let grads = self.backward(loss, params)?;
        let (grads, buffers) = match mode {
            GradMode::Fresh => (grads, Vec::new()),
            GradMode::Accumulate => {
                let mut out = Vec::with_capacity(grads.len());
                let mut buffers = Vec::with_capacity(grads.len());
                for (&p, &g) in params.iter().zip(&grads) {
                    let name = format!("grad.{}", self.node(p).name);
                    let ne = self.layout(p).ne;
                    let buf = self.persistent(&name, GgmlType::F32, &ne)?;
                    let sum = self.add(buf, g)?;
                    out.push(self.cpy(sum, buf)?);
                    buffers.push(buf);
                }
                (out, buffers)
            }
        };
        Ok(Gradients {
            params: params.to_vec(),
            grads,
            buffers,
        })
    }

    /// The full form: the loss gradient is seeded with `seed` (a loss scale, e.g. 1/n for n
    /// micro-batches), and `rule_override` may replace rules (tests of the gradient checker).
    #[doc(hidden)]
    pub fn backward_with(
        &mut self,
        loss: TensorId,
        params: &[TensorId],
        seed: f32,
        rule_override: Option<RuleOverride<'_>>,
    ) -> Result<Vec<TensorId>> {
        self.check_loss(loss)?;
        self.check_params(params, loss)?;
        let seed = self.fill(&[1], seed)?;
        let grads = self.propagate(&[(loss, seed)], params, rule_override)?;
        self.fill_missing(params, grads)
    }

    /// Gradients of scalar `loss` (seeded with `seed`) for `wrt`, which may be any F32 tensors
    /// (not only leaves): propagation stops at them, so what they depend on gets nothing. A
    /// tensor of `wrt` the loss does not depend on gets `None`.
    ///
    /// Lets a builder take part of the backward early: e.g. the loss of one chunk of tokens,
    /// differentiated for that chunk's hidden states right after it is computed, so its large
    /// intermediates (logits) die before the next chunk's are made. The rest of the model then
    /// starts from those gradients with [`Graph::backward_from`].
    pub fn backward_to(
        &mut self,
        loss: TensorId,
        wrt: &[TensorId],
        seed: f32,
    ) -> Result<Vec<Option<TensorId>>> {
        self.check_loss(loss)?;
        for &t in wrt {
            self.check_id("backward", t)?;
            if self.layout(t).dtype != GgmlType::F32 || t > loss {
                return err(
                    "backward",
                    format!(
                        "'{}' must be an F32 tensor created before the loss",
                        self.node(t).name
                    ),
                );
            }
        }
        let seed = self.fill(&[1], seed)?;
        self.propagate(&[(loss, seed)], wrt, None)
    }

    /// The gradients of `params` (F32 leaves) given the gradients of some tensors, `seeds`
    /// (tensor, its gradient), e.g. from [`Graph::backward_to`]: the backward of everything
    /// before them. A seed on a parameter is its contribution from outside. A parameter that
    /// gets nothing gets zeros.
    pub fn backward_from(
        &mut self,
        seeds: &[(TensorId, TensorId)],
        params: &[TensorId],
    ) -> Result<Vec<TensorId>> {
        const OP: &str = "backward";
        let Some(last) = seeds.iter().map(|s| s.0).max() else {
            return err(OP, "no seed gradients");
        };
        for &(t, d) in seeds {
            self.check_id(OP, t)?;
            self.check_id(OP, d)?;
            let (lt, ld) = (self.layout(t), self.layout(d));
            if lt.dtype != GgmlType::F32 || ld.dtype != GgmlType::F32 || lt.ne != ld.ne {
                return err(
                    OP,
                    format!(
                        "the gradient of '{}' must be F32 {:?}, got {} {:?}",
                        self.node(t).name,
                        lt.ne,
                        ld.dtype,
                        ld.ne
                    ),
                );
            }
        }
        self.check_params(params, last)?;
        let grads = self.propagate(seeds, params, None)?;
        self.fill_missing(params, grads)
    }

    fn check_loss(&self, loss: TensorId) -> Result<()> {
        self.check_id("backward", loss)?;
        let ll = *self.layout(loss);
        if ll.dtype != GgmlType::F32 || ll.n_elements() != 1 {
            return err(
                "backward",
                format!(
                    "the loss must be an F32 scalar, got {} {:?}",
                    ll.dtype, ll.ne
                ),
            );
        }
        Ok(())
    }

    fn check_params(&self, params: &[TensorId], before: TensorId) -> Result<()> {
        for &p in params {
            self.check_id("backward", p)?;
            let n = self.node(p);
            if n.op != Op::Leaf || n.layout.dtype != GgmlType::F32 || p > before {
                return err(
                    "backward",
                    format!(
                        "parameter '{}' must be an F32 leaf created before the loss",
                        n.name
                    ),
                );
            }
        }
        Ok(())
    }

    /// Zeros for the parameters that got no gradient.
    fn fill_missing(
        &mut self,
        params: &[TensorId],
        grads: Vec<Option<TensorId>>,
    ) -> Result<Vec<TensorId>> {
        params
            .iter()
            .zip(grads)
            .map(|(&p, g)| match g {
                Some(g) => Ok(g),
                None => {
                    let ne = self.layout(p).ne;
                    self.fill(&ne, 0.0)
                }
            })
            .collect()
    }

    /// Reverse-mode propagation from `seeds` down to the tensors of `wrt`, whose gradients it
    /// returns (in order; `None` where nothing reached one). Rules are not applied at `wrt`
    /// tensors, so propagation stops there.
    fn propagate(
        &mut self,
        seeds: &[(TensorId, TensorId)],
        wrt: &[TensorId],
        rule_override: Option<RuleOverride<'_>>,
    ) -> Result<Vec<Option<TensorId>>> {
        const OP: &str = "backward";
        let end = seeds.iter().map(|s| s.0.index() + 1).max().unwrap_or(0);
        // Which tensors depend on a `wrt` tensor through float values.
        let mut requires = vec![false; end];
        let mut stop = vec![false; end];
        for &t in wrt {
            if t.index() < end {
                requires[t.index()] = true;
                stop[t.index()] = true;
            }
        }
        for i in 0..end {
            let n = &self.nodes[i];
            if !requires[i]
                && n.op != Op::Leaf
                && n.layout.dtype == GgmlType::F32
                && n.src.iter().any(|s| requires[s.index()])
            {
                requires[i] = true;
            }
        }
        let mut grads: Vec<Option<TensorId>> = vec![None; end];
        for &(t, d) in seeds {
            if requires[t.index()] {
                grads[t.index()] = Some(match grads[t.index()] {
                    Some(prev) => self.add(prev, d)?,
                    None => d,
                });
            }
        }
        for i in (0..end).rev() {
            let Some(dy) = grads[i] else { continue };
            let node: Node = self.nodes[i].clone();
            if node.op == Op::Leaf || stop[i] {
                continue;
            }
            let needs: Vec<bool> = node.src.iter().map(|s| requires[s.index()]).collect();
            let id = TensorId(i as u32);
            let contributions = match rule_override.and_then(|f| f(self, id, dy, &needs)) {
                Some(c) => c?,
                None => self.backward_rule(id, dy, &needs)?,
            };
            for (k, c) in contributions.into_iter().enumerate() {
                let (Some(c), Some(&s)) = (c, node.src.get(k)) else {
                    continue;
                };
                if !needs[k] {
                    continue;
                }
                let want = self.layout(s).ne;
                if self.layout(c).ne != want || self.layout(c).dtype != GgmlType::F32 {
                    return err(
                        OP,
                        format!(
                            "the rule of '{}' gave a gradient {:?} for '{}' {:?}",
                            node.name,
                            self.layout(c).ne,
                            self.node(s).name,
                            want
                        ),
                    );
                }
                grads[s.index()] = Some(match grads[s.index()] {
                    Some(prev) => self.add(prev, c)?,
                    None => c,
                });
            }
        }
        Ok(wrt
            .iter()
            .map(|t| grads.get(t.index()).copied().flatten())
            .collect())
    }

    /// One AdamW state (persistent moments `m.<name>`, `v.<name>`) and update per parameter,
    /// all reading the hyperparameters `hp` (F32 `[7]`, see [`Graph::adamw_step`]).
    pub fn adamw_all(&mut self, grads: &Gradients, hp: TensorId) -> Result<Vec<AdamState>> {
        let mut out = Vec::with_capacity(grads.params.len());
        for (&p, &g) in grads.params.iter().zip(&grads.grads) {
            let name = self.node(p).name.clone();
            let ne = self.layout(p).ne;
            let m = self.persistent(&format!("adam_m.{name}"), GgmlType::F32, &ne)?;
            let v = self.persistent(&format!("adam_v.{name}"), GgmlType::F32, &ne)?;
            let update = self.adamw_step(p, g, m, v, hp)?;
            out.push(AdamState { m, v, update });
        }
        Ok(out)
    }

    /// True when `t`'s memory is a persistent tensor (itself or through views).
    pub fn is_persistent(&self, t: TensorId) -> bool {
        self.node(self.root(t).0).mem == Mem::Persistent
    }
}

/// A parameter's AdamW moments and its update node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdamState {
    pub m: TensorId,
    pub v: TensorId,
    pub update: TensorId,
}
