//! The all-reduce of a data-parallel step: every gradient buffer of the grad pass is summed
//! across the ranks in place, in buckets of at most [`BUCKET`] values, together with a few
//! host values (the step's loss, the ranks' stop votes) that ride in the last bucket.
//!
//! A tensor of a bucket's size or more is reduced straight from its bytes, a bucket at a time,
//! into the receive buffer and copied back; smaller tensors are packed into the send buffer
//! first, so a model's many small tensors (norms, biases, LoRA factors) cost few reductions.
//! The squared norm of the summed gradient is taken as it is copied back: after the
//! reduction, every rank holds the same gradient and so takes the same clipping and
//! skip-a-non-finite-step decisions.

use tinynn_core::backend::Backend;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;

use crate::collective::Collective;
use crate::error::{backend_err, Result, TrainError};
use crate::tensor_io::as_f32;

/// Values per reduction (4 MiB of f32): large enough that a message's latency is small
/// against its transfer, small enough that the staging buffers stay small.
pub const BUCKET: usize = 1 << 20;

/// Where a packed piece of the bucket goes back to.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Gradient buffer `index`, from its first value.
    Buffer(usize),
    /// The host values, from their first.
    Extras,
}

#[derive(Clone, Copy, Debug)]
struct Piece {
    target: Target,
    /// Offset in the bucket.
    at: usize,
    len: usize,
}

/// The staging buffers, reused by every step (made on the first).
#[derive(Default)]
pub(crate) struct GradReducer {
    send: Vec<f32>,
    recv: Vec<f32>,
    pieces: Vec<Piece>,
    fill: usize,
    /// Σ of the summed gradient's squares so far (this step).
    sq: f64,
}

impl GradReducer {
    /// Sums the gradient `buffers` of `mem` and `extras` over the ranks of `comm` in place;
    /// returns the squared L2 norm of the summed gradient.
    pub fn all_reduce<B: Backend>(
        &mut self,
        backend: &B,
        (mem, plan): (&mut B::Memory, &Plan),
        buffers: &[TensorId],
        extras: &mut [f32],
        comm: &mut dyn Collective,
    ) -> Result<f64> {
        if extras.len() > BUCKET {
            return Err(TrainError::Invalid(format!(
                "{} host values to reduce; at most {BUCKET}",
                extras.len()
            )));
        }
        if self.send.is_empty() {
            let total: usize = buffers
                .iter()
                .map(|&t| backend.persistent_len(mem, plan, t) / 4)
                .sum::<usize>()
                + extras.len();
            let cap = total.clamp(1, BUCKET);
            self.send = vec![0.0; cap];
            self.recv = vec![0.0; cap];
            self.pieces = Vec::with_capacity(buffers.len() + 1);
        }
        let cap = self.send.len();
        self.fill = 0;
        self.sq = 0.0;
        self.pieces.clear();
        for (i, &t) in buffers.iter().enumerate() {
            let n = backend.persistent_len(mem, plan, t) / 4;
            if n >= cap {
                self.flush(backend, (mem, plan), buffers, extras, comm)?;
                for start in (0..n).step_by(cap) {
                    let len = (n - start).min(cap);
                    {
                        let bytes = backend.persistent(mem, plan, t).map_err(backend_err)?;
                        let src = &as_f32(bytes, plan, t)?[start..start + len];
                        comm.all_reduce_sum_f32(src, &mut self.recv[..len])?;
                    }
                    self.sq += write_back(backend, (mem, plan), t, start, &self.recv[..len])?;
                }
                continue;
            }
            if self.fill + n > cap {
                self.flush(backend, (mem, plan), buffers, extras, comm)?;
            }
            let bytes = backend.persistent(mem, plan, t).map_err(backend_err)?;
            let src = as_f32(bytes, plan, t)?;
            self.send[self.fill..self.fill + n].copy_from_slice(&src[..n]);
            self.pieces.push(Piece {
                target: Target::Buffer(i),
                at: self.fill,
                len: n,
            });
            self.fill += n;
        }
        if self.fill + extras.len() > cap {
            self.flush(backend, (mem, plan), buffers, extras, comm)?;
        }
        let n = extras.len();
        self.send[self.fill..self.fill + n].copy_from_slice(extras);
        self.pieces.push(Piece {
            target: Target::Extras,
            at: self.fill,
            len: n,
        });
        self.fill += n;
        self.flush(backend, (mem, plan), buffers, extras, comm)?;
        Ok(self.sq)
    }

    /// Reduces the packed bucket and copies each piece back where it came from.
    fn flush<B: Backend>(
        &mut self,
        backend: &B,
        (mem, plan): (&mut B::Memory, &Plan),
        buffers: &[TensorId],
        extras: &mut [f32],
        comm: &mut dyn Collective,
    ) -> Result<()> {
        if self.pieces.is_empty() {
            return Ok(());
        }
        let n = self.fill;
        comm.all_reduce_sum_f32(&self.send[..n], &mut self.recv[..n])?;
        for p in &self.pieces {
            let summed = &self.recv[p.at..p.at + p.len];
            match p.target {
                Target::Buffer(i) => {
                    self.sq += write_back(backend, (mem, plan), buffers[i], 0, summed)?;
                }
                Target::Extras => extras.copy_from_slice(summed),
            }
        }
        self.pieces.clear();
        self.fill = 0;
        Ok(())
    }
}

/// Writes `values` into F32 tensor `t` from value `start`; returns Σ values².
fn write_back<B: Backend>(
    backend: &B,
    (mem, plan): (&mut B::Memory, &Plan),
    t: TensorId,
    start: usize,
    values: &[f32],
) -> Result<f64> {
    let mut failed = None;
    backend
        .fill_persistent(
            mem,
            plan,
            t,
            &mut |bytes| match bytemuck::try_cast_slice_mut::<u8, f32>(bytes) {
                Ok(dst) if dst.len() >= start + values.len() => {
                    dst[start..start + values.len()].copy_from_slice(values);
                }
                Ok(dst) => {
                    failed = Some(format!(
                        "{} values, not {}",
                        dst.len(),
                        start + values.len()
                    ))
                }
                Err(e) => failed = Some(e.to_string()),
            },
        )
        .map_err(backend_err)?;
    if let Some(message) = failed {
        return Err(TrainError::Param {
            name: plan.graph().node(t).name.clone(),
            message: format!("writing the summed gradient: {message}"),
        });
    }
    Ok(values.iter().map(|&v| f64::from(v) * f64::from(v)).sum())
}
