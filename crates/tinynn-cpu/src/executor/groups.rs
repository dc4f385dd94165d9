//! Which steps of a plan may follow each other without a barrier between them, and which
//! small weights to fetch a group early ([`Schedule`]).
//!
//! A barrier after every step is what makes the executor correct without knowing anything
//! about the kernels, and on a decode token it is ~570 meetings of every thread. Two kinds of
//! neighbours do not need one:
//! - **Independent steps**: neither writes bytes the other reads or writes (q, k and v's
//!   products of one normalized row; gate and up; the two RoPEs; the two KV-cache writes).
//! - **A row-wise chain**: ops whose output row `r` reads only row `r` of the tensors they
//!   share with the chain (RMS norm, element-wise binary ops on whole rows), over the same
//!   rows. Every such kernel gives row `r` to the same thread (`split` of the row count), so
//!   a thread reads only rows it wrote itself (the residual add, the norm and its weight).
//!
//! Only ops whose kernels are known to touch nothing but their sources, their output and
//! their work buffer join a group; any other op has a barrier before and after it. A group
//! is at most [`MAX_GROUP`] steps (each has its own work counter, see `Job::claims`).

use tinynn_core::ops::Op;
use tinynn_core::plan::{Location, Plan, Region};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

/// Most steps run between two barriers.
pub(crate) const MAX_GROUP: usize = 8;

/// Bytes of one region a step touches.
#[derive(Clone, Copy, Debug)]
pub(super) struct Touch {
    /// The tensor (None: the step's work buffer).
    pub(super) tensor: Option<TensorId>,
    region: Region,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) write: bool,
}

impl Touch {
    pub(super) fn overlaps(&self, o: &Touch) -> bool {
        self.region == o.region && self.start < o.end && o.start < self.end
    }
}

/// Small weights (norm scales, biases) up to this size are fetched a group ahead.
const AHEAD_MAX_BYTES: usize = 16 << 10;

/// A small weight to ask the caches for: `bytes` at `offset` in weight slot `slot`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Fetch {
    pub(crate) slot: usize,
    pub(crate) offset: usize,
    pub(crate) bytes: usize,
}

/// How a plan runs: where the barriers are, and what to fetch early.
pub(crate) struct Schedule {
    /// Per step: a barrier follows it.
    pub(crate) sync: Vec<bool>,
    /// Per step (non-empty only where a group starts): the small weights of the next group.
    /// A decode token streams the whole model through the caches, so a norm's scale is cold
    /// when its row-wise step comes; thread 0 (which runs a one-row step) asks for it while
    /// the group before runs.
    pub(crate) ahead: Vec<Vec<Fetch>>,
    /// Per step: the products starting there that run as one (`fused::fused_runs`).
    pub(crate) fused: Vec<usize>,
    /// Per step: the fused run starting there computes the gated unit after it
    /// (`fused::glu_epilogues`).
    pub(crate) glu: Vec<bool>,
}

impl Schedule {
    pub(crate) fn of(plan: &Plan) -> Schedule {
        let mut sync = sync_after(plan);
        let fused = super::fused::fused_runs(plan, &sync);
        let glu = super::fused::glu_epilogues(plan, &mut sync, &fused);
        let mut ahead = vec![Vec::new(); sync.len()];
        let starts: Vec<usize> = std::iter::once(0)
            .chain((1..sync.len()).filter(|&i| sync[i - 1]))
            .collect();
        for (k, &start) in starts.iter().enumerate() {
            if let Some(&next) = starts.get(k + 1) {
                let end = starts.get(k + 2).copied().unwrap_or(sync.len());
                ahead[start] = small_weights(plan, next..end);
            }
        }
        Schedule {
            sync,
            ahead,
            fused,
            glu,
        }
    }

    /// A barrier after every step, nothing fetched early.
    pub(crate) fn plain(n_steps: usize) -> Schedule {
        Schedule {
            sync: vec![true; n_steps],
            ahead: vec![Vec::new(); n_steps],
            fused: vec![0; n_steps],
            glu: vec![false; n_steps],
        }
    }
}

/// The F32 weights of at most [`AHEAD_MAX_BYTES`] that `steps` read.
fn small_weights(plan: &Plan, steps: std::ops::Range<usize>) -> Vec<Fetch> {
    let g = plan.graph();
    let mut out = Vec::new();
    for step in &plan.steps()[steps] {
        for &s in &g.node(step.node).src {
            let l = g.layout(s);
            let bytes = l.span_bytes();
            if let Some(Location {
                region: Region::Weight(w),
                offset,
            }) = plan.location(s)
            {
                if l.dtype == GgmlType::F32 && bytes <= AHEAD_MAX_BYTES {
                    out.push(Fetch {
                        slot: w as usize,
                        offset,
                        bytes,
                    });
                }
            }
        }
    }
    out
}

/// Per step: a barrier must follow it (the last step always has one).
pub(crate) fn sync_after(plan: &Plan) -> Vec<bool> {
    let steps = plan.steps();
    let touches: Vec<Option<Vec<Touch>>> = (0..steps.len()).map(|i| touches(plan, i)).collect();
    let mut sync = vec![true; steps.len()];
    let mut group_start = 0;
    for j in 1..steps.len() {
        let joins = j - group_start < MAX_GROUP
            && touches[j].as_ref().is_some_and(|tj| {
                (group_start..j).all(|i| {
                    touches[i]
                        .as_ref()
                        .is_some_and(|ti| compatible(plan, i, ti, j, tj))
                })
            });
        if joins {
            sync[j - 1] = false;
        } else {
            group_start = j;
        }
    }
    sync
}

/// What step `i` reads and writes, or None when its op does not join groups.
pub(super) fn touches(plan: &Plan, i: usize) -> Option<Vec<Touch>> {
    let step = plan.steps()[i];
    let node = plan.graph().node(step.node);
    let groupable = matches!(
        node.op,
        Op::MulMat
            | Op::Rope { .. }
            | Op::SetRows
            | Op::RmsNorm { .. }
            | Op::Binary(_)
            | Op::SwiGlu
            | Op::GetRows
            | Op::Scale(_)
    );
    if !groupable {
        return None;
    }
    let mut out = Vec::with_capacity(node.src.len() + 2);
    for &s in &node.src {
        out.push(tensor_touch(plan, s, false)?);
    }
    out.push(tensor_touch(plan, step.node, true)?);
    if let Some((offset, bytes)) = step.work {
        out.push(Touch {
            tensor: None,
            region: Region::Arena,
            start: offset,
            end: offset + bytes,
            write: true,
        });
    }
    Some(out)
}

/// Tensor `t`'s bytes, read or written (None when the plan placed it nowhere).
pub(super) fn tensor_touch(plan: &Plan, t: TensorId, write: bool) -> Option<Touch> {
    let Location { region, offset } = plan.location(t)?;
    let bytes = plan.graph().layout(t).span_bytes();
    Some(Touch {
        tensor: Some(t),
        region,
        start: offset,
        end: offset + bytes,
        write,
    })
}

/// Step `j` may run right after step `i` (both in one group) on every thread.
fn compatible(plan: &Plan, i: usize, ti: &[Touch], j: usize, tj: &[Touch]) -> bool {
    ti.iter().all(|a| {
        tj.iter()
            .all(|b| !(a.write || b.write) || !a.overlaps(b) || same_rows(plan, i, a, j, b))
    })
}

/// `a` (of step `i`) and `b` (of step `j`) are the same tensor bytes, which both row-wise
/// steps index by their output's row: every thread touches in `j` only rows it touched in
/// `i`.
fn same_rows(plan: &Plan, i: usize, a: &Touch, j: usize, b: &Touch) -> bool {
    let g = plan.graph();
    let (Some(ta), Some(tb)) = (a.tensor, b.tensor) else {
        return false;
    };
    let [di, dj] = [i, j].map(|k| plan.steps()[k].node);
    let (la, lb) = (g.layout(ta), g.layout(tb));
    let rows = |l: &tinynn_core::tensor::Layout| [l.ne[1], l.ne[2], l.ne[3]];
    row_wise(plan, i)
        && row_wise(plan, j)
        && a.start == b.start
        && la == lb
        && rows(la) == rows(g.layout(di))
        && rows(la) == rows(g.layout(dj))
        && la.ne[0] == g.layout(di).ne[0]
        && la.ne[0] == g.layout(dj).ne[0]
}

/// The step's kernel computes output row `r` (of `split(n_rows)`, the thread's rows) from
/// row `r` of every source with the output's shape, and from nothing else that a group
/// writes: RMS norm, and binary ops on contiguous F32 rows (the kernel's row path).
fn row_wise(plan: &Plan, i: usize) -> bool {
    let g = plan.graph();
    let node = g.node(plan.steps()[i].node);
    let f32_rows = |t: TensorId| {
        let l = g.layout(t);
        l.dtype == GgmlType::F32 && l.nb[0] == 4
    };
    match node.op {
        Op::RmsNorm { .. } => node.src.len() == 1 && f32_rows(node.src[0]),
        Op::Binary(_) => {
            node.src.len() == 2
                && node.src.iter().all(|&s| f32_rows(s))
                && g.layout(node.src[1]).ne[0] == node.layout.ne[0]
                && node.layout.dtype == GgmlType::F32
        }
        _ => false,
    }
}

#[cfg(test)]
#[path = "groups_tests.rs"]
mod tests;
