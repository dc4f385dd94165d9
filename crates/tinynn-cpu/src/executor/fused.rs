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
//!
//! A run of two products whose outputs only feed the gated unit right after (SwiGLU, GeGLU:
//! `s = act(gate) · up`, alone in the next group) takes that step in as its epilogue
//! ([`glu_epilogues`]): the run hands out pairs of groups, the gate's group `g` and the up
//! product's group `g`, and the thread that computed both computes `s` on those 16 columns
//! while they are in its caches. One step and one barrier fewer a layer, and `s`'s columns
//! are the same bits (the row kernels give the same value for a column whatever slice of
//! the row they are given).

use tinynn_core::ops::Op;
use tinynn_core::plan::{Plan, Region};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

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

/// Per step: whether the fused run starting there takes the gated-unit step right after it
/// as its epilogue (see the module comment); where it does, the barrier between the run and
/// that step is taken out of `sync`. Only when the run is two products (gate, then up), the
/// step reads exactly their outputs, F32 with contiguous rows of one shape, stands alone in
/// its group, and writes bytes the run's steps do not touch (or exactly the gate's or the
/// up product's output: in place, each thread writes only columns it computed and read).
pub(crate) fn glu_epilogues(plan: &Plan, sync: &mut [bool], fused: &[usize]) -> Vec<bool> {
    let g = plan.graph();
    let steps = plan.steps();
    let mut glu = vec![false; steps.len()];
    for i in 0..steps.len() {
        let j = i + 2;
        if fused[i] != 2 || j >= steps.len() || !sync[i + 1] || !sync[j] {
            continue;
        }
        let node = g.node(steps[j].node);
        let (gate, up) = (steps[i].node, steps[i + 1].node);
        if !matches!(node.op, Op::SwiGlu | Op::GeGlu) || node.src[..] != [gate, up] {
            continue;
        }
        let rows_f32 = |t: TensorId| {
            let l = g.layout(t);
            l.dtype == GgmlType::F32 && l.is_contiguous() && l.ne == node.layout.ne
        };
        // The group's steps before the pair run beside the unit too. None of their bytes may
        // overlap the unit's output, except the gate's or up's output exactly (in place).
        let start = (0..i).rev().find(|&k| sync[k]).map_or(0, |k| k + 1);
        let out = groups::tensor_touch(plan, steps[j].node, true);
        let clear = out.is_some_and(|o| {
            (start..j).all(|k| {
                groups::touches(plan, k).is_some_and(|ts| {
                    ts.iter().all(|t| {
                        let in_place = t.write
                            && matches!(t.tensor, Some(x) if x == gate || x == up)
                            && (t.start, t.end) == (o.start, o.end);
                        in_place || !t.overlaps(&o)
                    })
                })
            })
        });
        // With the unit, the group holds its steps before the pair, the pair and the unit.
        let fits = i + 3 - start <= super::groups::MAX_GROUP;
        if rows_f32(gate) && rows_f32(up) && rows_f32(steps[j].node) && clear && fits {
            sync[i + 1] = false;
            glu[i] = true;
        }
    }
    glu
}

impl Job<'_> {
    /// Runs the products of the fused run starting at step `i` (`first` is its args, `claims`
    /// its work counter) as one (see `fused`), and the gated unit after them where the
    /// schedule says so (`glu`). Returns how many steps after `i` it computed: 0, having done
    /// nothing, when no run starts at `i` or it cannot run fused (then each product runs
    /// alone). Every thread decides the same: the same plan, weights and shapes.
    pub(super) fn run_fused(
        &self,
        i: usize,
        claims: usize,
        first: &StepArgs<'_>,
        ctx: &crate::pool::Ctx<'_>,
    ) -> usize {
        let n = self.schedule.fused[i].min(groups::MAX_GROUP);
        if n < 2 {
            return 0;
        }
        // The run's other products use no work counter of their own: the first one's serves.
        let mut parts = [*first; groups::MAX_GROUP];
        for (j, p) in parts.iter_mut().enumerate().take(n).skip(1) {
            *p = self.step_args(i + j, 0);
        }
        if !self.schedule.glu[i] {
            return if kernels::mul_mat_fused(&parts[..n], None, ctx) {
                n - 1
            } else {
                0
            };
        }
        let glu = self.step_args(i + n, 0);
        if kernels::mul_mat_fused(&parts[..n], Some((glu.op, glu.dst)), ctx) {
            return n;
        }
        // Each product alone, then the barrier the schedule took out, then the gated unit.
        kernels::compute(first, ctx);
        for j in 1..n {
            kernels::compute(&self.step_args(i + j, claims + j), ctx);
        }
        if ctx.barrier().is_ok() {
            kernels::compute(&self.step_args(i + n, claims + n), ctx);
        }
        n
    }
}
