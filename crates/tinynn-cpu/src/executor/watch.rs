//! The watch list of [`Executor::run_observed`](super::Executor::run_observed), checked
//! before a run: what makes handing a tensor's bytes out mid-run sound.

use tinynn_core::plan::{Plan, Region};
use tinynn_core::tensor::TensorId;

use super::ExecError;

/// `watch` is ascending, and each `(step, t)` names a persistent tensor `t` of `plan` and the
/// last step that writes it ([`Plan::last_writes`]): no later step writes its bytes.
pub(super) fn check(plan: &Plan, watch: &[(usize, TensorId)]) -> Result<(), ExecError> {
    let targets: Vec<TensorId> = watch.iter().map(|&(_, t)| t).collect();
    let last = plan.last_writes(&targets);
    let mut previous = 0;
    for (&(step, t), last) in watch.iter().zip(last) {
        let why = match plan.location(t).map(|l| l.region) {
            Some(Region::Persistent(_)) if last != Some(step) => {
                "it is not the last step writing it"
            }
            Some(Region::Persistent(_)) if step < previous => "the steps are not ascending",
            Some(Region::Persistent(_)) => {
                previous = step;
                continue;
            }
            _ => "it is not a persistent tensor of this plan",
        };
        let name = plan.graph().node(t).name.clone();
        return Err(ExecError::BadWatch { name, step, why });
    }
    Ok(())
}
