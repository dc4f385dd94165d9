//! Typed reads and writes of a plan's tensors through [`Backend`]: the trainer's inputs go in
//! as bytes (`Backend::write`), losses and values come back with `Backend::read_f32` (a
//! reused buffer for the scalars a step reads, so steps allocate nothing), and persistent F32
//! bytes are viewed as values where they are.

use tinynn_core::backend::Backend;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use crate::error::{backend_err, Result, TrainError};

/// Writes `bytes` (values of type `dtype`) into the start of persistent tensor `t`, which
/// must be of that type.
fn write_typed<B: Backend>(
    backend: &B,
    (mem, plan): (&mut B::Memory, &Plan),
    t: TensorId,
    dtype: GgmlType,
    bytes: &[u8],
) -> Result<()> {
    let have = plan.graph().layout(t).dtype;
    if have != dtype {
        let name = &plan.graph().node(t).name;
        return Err(TrainError::Invalid(format!(
            "'{name}' is {have}, not {dtype}"
        )));
    }
    backend.write(mem, plan, t, 0, bytes).map_err(backend_err)
}

/// Writes f32 values into the start of F32 persistent tensor `t`.
pub(crate) fn write_f32<B: Backend>(
    backend: &B,
    at: (&mut B::Memory, &Plan),
    t: TensorId,
    values: &[f32],
) -> Result<()> {
    write_typed(backend, at, t, GgmlType::F32, bytemuck::cast_slice(values))
}

/// Writes i32 values (token ids, positions) into the start of I32 persistent tensor `t`.
pub(crate) fn write_i32<B: Backend>(
    backend: &B,
    at: (&mut B::Memory, &Plan),
    t: TensorId,
    values: &[i32],
) -> Result<()> {
    write_typed(backend, at, t, GgmlType::I32, bytemuck::cast_slice(values))
}

/// The values of F32 tensor `t` (an output or a persistent tensor).
pub(crate) fn read_f32<B: Backend>(
    backend: &B,
    mem: &B::Memory,
    plan: &Plan,
    t: TensorId,
) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    backend
        .read_f32(plan, mem, t, &mut out)
        .map_err(backend_err)?;
    Ok(out)
}

/// The first value of F32 tensor `t`, read through `buf` (no allocation once it has room).
pub(crate) fn scalar<B: Backend>(
    backend: &B,
    (mem, plan): (&B::Memory, &Plan),
    t: TensorId,
    buf: &mut Vec<f32>,
) -> Result<f32> {
    buf.clear();
    backend.read_f32(plan, mem, t, buf).map_err(backend_err)?;
    buf.first().copied().ok_or_else(|| {
        TrainError::Invalid(format!("'{}' has no values", plan.graph().node(t).name))
    })
}

/// Persistent F32 bytes as values, where they are.
pub(crate) fn as_f32<'a>(bytes: &'a [u8], plan: &Plan, t: TensorId) -> Result<&'a [f32]> {
    bytemuck::try_cast_slice(bytes).map_err(|e| TrainError::Param {
        name: plan.graph().node(t).name.clone(),
        message: format!("the backend's bytes are not f32 values: {e}"),
    })
}
