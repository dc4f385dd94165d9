//! Products of one activation that run as one list of work: q, k and v of a normalized row,
//! gate and up.
//!
//! Steps in a group run without a barrier between them, but each product still hands out its
//! own 16-row groups: every thread starts a new stream of weights at each product (the
//! memory's prefetchers take a while to follow it), quantizes the same activation row again,
//! and ends on its own tail of claimed work. In a decode token measured at ~50 GB/s the 118 KB
//! k and v products streamed at 24–28 GB/s and the 353 KB q product at ~32, while the 940 KB
//! ones reached 41–47 and the head 50–61. A run of products that read the same activation
//! tensor inside one group is handed out as one range of groups instead
//! (`kernels::matmul::mul_mat_fused`): the activation prepared once, one thread's share
//! crossing from one weight into the next, one tail. Each output column is still computed by
//! one thread with the same kernel, so the bits are the same.

use tinynn_core::ops::Op;
use tinynn_core::plan::{Plan, Region};

use super::{groups, Job};
use crate::kernels::{self, StepArgs};

/// Per step: how many products starting there run as one (0 or 1: the step runs alone). A
/// run is ≥ 2 consecutive `MulMat` steps with no barrier between them (`sync`), each with a
/// weight as its matrix, all with the same activation tensor. Whether they can run fused is
/// decided at run time (`Job::run_fused`: packed copies with one activation format).
pub(crate) fn fused_runs(plan: &Plan, sync: &[bool]) -> Vec<usize> {
    let g = plan.graph();
    let steps = plan.steps();
    let product_of = |k: usize| {
        let node = g.node(steps[k].node);
        let weight = node
            .src
            .first()
            .and_then(|&w| plan.location(w))
            .is_some_and(|l| matches!(l.region, Region::Weight(_)));
        (node.op == Op::MulMat && weight)
            .then(|| node.src.get(1).copied())
            .flatten()
    };
    let mut runs = vec![0; steps.len()];
    let mut i = 0;
    while i < steps.len() {
        let Some(x) = product_of(i) else {
            i += 1;
            continue;
        };
        let mut n = 1;
        while i + n < steps.len() && !sync[i + n - 1] && product_of(i + n) == Some(x) {
            n += 1;
        }
        if n > 1 {
            runs[i] = n;
        }
        i += n;
    }
    runs
}

impl Job<'_> {
    /// Runs the products of the fused run starting at step `i` (`first` is its args) as one
    /// (see `fused`); false, having done nothing, when they cannot run so (then each runs
    /// alone). Every thread decides the same: the same plan, weights and shapes.
    pub(super) fn run_fused(
        &self,
        i: usize,
        first: &StepArgs<'_>,
        ctx: &crate::pool::Ctx<'_>,
    ) -> bool {
        let n = self.schedule.fused[i].min(groups::MAX_GROUP);
        // The run's other products use no work counter of their own: the first one's serves.
        let mut parts = [*first; groups::MAX_GROUP];
        for (j, p) in parts.iter_mut().enumerate().take(n).skip(1) {
            *p = self.step_args(i + j, 0);
        }
        kernels::mul_mat_fused(&parts[..n], ctx)
    }
}
