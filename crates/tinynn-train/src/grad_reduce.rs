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
//!
//! Overlap ([`GradReducer::run_overlapped`]): the last micro-batch's grad pass runs on a
//! second thread while this one reduces. The backend hands out each gradient buffer as soon
//! as the last step writing it has run ([`Backend::run_observed`]) — the output layer's
//! first, while the backward pass is still working down the layers; it is copied into a
//! staging vector and reduced in the order it became final, which is the same on every
//! rank (the ranks share one plan). Staging is bounded (`TrainConfig::overlap_bytes`,
//! [`OVERLAP_BYTES`] by default): buffers past it, and any the plan never writes, are reduced
//! from their own bytes after the run.
//! Only this thread calls the collective.

use std::collections::HashMap;
use std::sync::{mpsc, Mutex, PoisonError};

use tinynn_core::backend::Backend;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;

use crate::collective::Collective;
use crate::error::{backend_err, Result, TrainError};
use crate::tensor_io::as_f32;

/// Values per reduction (4 MiB of f32): large enough that a message's latency is small
/// against its transfer, small enough that the staging buffers stay small.
pub const BUCKET: usize = 1 << 20;

/// By default, at most this many bytes of gradients are staged for reduction during the
/// backward pass (1 GiB: all of a 135M-parameter model's, the last layers' of a bigger one).
pub const OVERLAP_BYTES: usize = 1 << 30;

/// Where a packed piece of the bucket goes back to.
#[derive(Clone, Copy, Debug)]
enum Target {
    /// Gradient buffer `index`, from its first value.
    Buffer(usize),
    /// The staged copy of gradient buffer `index` (overlapped reduction).
    Staged(usize),
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
    /// Overlap, set up on first use: `(step, buffer)` for the staged buffers, ascending;
    /// each staged buffer's index; its staging vector (taken by the run's thread, filled,
    /// and sent here).
    watch: Option<Vec<(usize, TensorId)>>,
    index: HashMap<TensorId, usize>,
    staging: Vec<Mutex<Vec<f32>>>,
    /// Per buffer: its summed values, reduced during the run, waiting to be written back.
    reduced: Vec<Option<Vec<f32>>>,
    /// Seconds spent in the collective's calls, all steps.
    pub comm_secs: f64,
}

/// `comm`'s sum of `send` into `recv`, timed into `secs`.
fn sum(comm: &mut dyn Collective, send: &[f32], recv: &mut [f32], secs: &mut f64) -> Result<()> {
    let started = std::time::Instant::now();
    let summed = comm.all_reduce_sum_f32(send, recv);
    *secs += started.elapsed().as_secs_f64();
    summed
}

/// Locks `m`, also after a panic elsewhere (a poisoned vector is only refilled).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
        let total: usize = buffers
            .iter()
            .map(|&t| backend.persistent_len(mem, plan, t) / 4)
            .sum::<usize>();
        self.ensure_room(total + extras.len());
        let cap = self.send.len();
        self.fill = 0;
        self.sq = 0.0;
        self.pieces.clear();
        for (i, &t) in buffers.iter().enumerate() {
            if let Some(summed) = self.reduced.get_mut(i).and_then(Option::take) {
                self.sq += write_back(backend, (mem, plan), t, 0, &summed)?;
                *lock(&self.staging[i]) = summed;
                continue;
            }
            let n = backend.persistent_len(mem, plan, t) / 4;
            if n >= cap {
                self.flush(backend, (mem, plan), buffers, extras, comm)?;
                for start in (0..n).step_by(cap) {
                    let len = (n - start).min(cap);
                    {
                        let bytes = backend.persistent(mem, plan, t).map_err(backend_err)?;
                        let src = &as_f32(bytes, plan, t)?[start..start + len];
                        sum(comm, src, &mut self.recv[..len], &mut self.comm_secs)?;
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

    /// Runs `plan` (the last micro-batch's grad pass) on another thread and reduces each
    /// gradient buffer here as soon as it is final; [`GradReducer::all_reduce`] then writes
    /// them back and reduces the rest. Returns the seconds from the run's end until the
    /// reductions started during it were done (the part of them the run did not hide).
    pub fn run_overlapped<B: Backend>(
        &mut self,
        backend: &mut B,
        (mem, plan): (&mut B::Memory, &Plan),
        buffers: &[TensorId],
        limit: usize,
        comm: &mut dyn Collective,
    ) -> Result<f64> {
        self.prepare(backend, (mem, plan), buffers, limit);
        self.fill = 0;
        self.pieces.clear();
        // Lent to the run's thread for the run (what is reduced here uses the rest).
        let watch = self.watch.take().unwrap_or_default();
        let index = std::mem::take(&mut self.index);
        let staging = std::mem::take(&mut self.staging);
        let (w, index_ref, staging_ref) = (&watch[..], &index, &staging);
        let (tx, rx) = mpsc::channel::<(usize, Vec<f32>)>();
        let ready = move |t: TensorId, bytes: &[u8]| {
            let Some(&i) = index_ref.get(&t) else { return };
            let mut v = std::mem::take(&mut *lock(&staging_ref[i]));
            v.clear();
            match bytemuck::try_cast_slice::<u8, f32>(bytes) {
                Ok(values) => v.extend_from_slice(values),
                Err(_) => v.extend(
                    bytes
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                ),
            }
            // The receiver is gone only when reducing failed; the error is reported there.
            let _ = tx.send((i, v));
        };
        let (ran, reduced) = std::thread::scope(|s| {
            let run = s.spawn(move || {
                let ran = backend.run_observed(plan, mem, w, &ready);
                (ran, std::time::Instant::now())
            });
            let mut reduced = Ok(());
            for (i, v) in rx {
                reduced = self.reduce_staged(i, v, comm);
                if reduced.is_err() {
                    break;
                }
            }
            (run.join(), reduced)
        });
        (self.watch, self.index, self.staging) = (Some(watch), index, staging);
        let ended = match ran {
            Ok((Ok(()), ended)) => ended,
            Ok((Err(e), _)) => return Err(backend_err(e)),
            Err(panic) => std::panic::resume_unwind(panic),
        };
        reduced?;
        self.flush_staged(comm)?;
        Ok(ended.elapsed().as_secs_f64())
    }

    /// Makes the send and receive buffers hold `values` values, up to a bucket.
    fn ensure_room(&mut self, values: usize) {
        let cap = values.clamp(1, BUCKET);
        if self.send.len() < cap {
            self.send = vec![0.0; cap];
            self.recv = vec![0.0; cap];
        }
    }

    /// Sizes the staging buffers and picks the buffers to stage, once.
    fn prepare<B: Backend>(
        &mut self,
        backend: &B,
        (mem, plan): (&B::Memory, &Plan),
        buffers: &[TensorId],
        limit: usize,
    ) {
        if self.watch.is_some() {
            return;
        }
        let total = buffers
            .iter()
            .map(|&t| backend.persistent_len(mem, plan, t) / 4)
            .sum::<usize>();
        // (With room for the host values that ride in the last bucket.)
        self.ensure_room(total + 64);
        let mut order: Vec<(usize, usize)> = plan
            .last_writes(buffers)
            .into_iter()
            .enumerate()
            .filter_map(|(i, step)| Some((step?, i)))
            .collect();
        order.sort_unstable();
        let (mut watch, mut staged) = (Vec::new(), 0usize);
        self.staging = buffers.iter().map(|_| Mutex::new(Vec::new())).collect();
        for (step, i) in order {
            let bytes = backend.persistent_len(mem, plan, buffers[i]);
            if staged + bytes > limit {
                break;
            }
            staged += bytes;
            watch.push((step, buffers[i]));
            self.index.insert(buffers[i], i);
            *lock(&self.staging[i]) = Vec::with_capacity(bytes / 4);
        }
        self.reduced = buffers.iter().map(|_| None).collect();
        self.watch = Some(watch);
    }

    /// Reduces the staged copy `v` of buffer `i` (straight, when it fills a bucket; packed
    /// with others otherwise).
    fn reduce_staged(
        &mut self,
        i: usize,
        mut v: Vec<f32>,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let cap = self.send.len();
        let n = v.len();
        if n >= cap {
            self.flush_staged(comm)?;
            for start in (0..n).step_by(cap) {
                let len = (n - start).min(cap);
                sum(
                    comm,
                    &v[start..start + len],
                    &mut self.recv[..len],
                    &mut self.comm_secs,
                )?;
                v[start..start + len].copy_from_slice(&self.recv[..len]);
            }
            self.reduced[i] = Some(v);
            return Ok(());
        }
        if self.fill + n > cap {
            self.flush_staged(comm)?;
        }
        self.send[self.fill..self.fill + n].copy_from_slice(&v);
        self.pieces.push(Piece {
            target: Target::Staged(i),
            at: self.fill,
            len: n,
        });
        self.fill += n;
        self.reduced[i] = Some(v);
        Ok(())
    }

    /// Reduces the packed bucket of staged pieces into their staged vectors.
    fn flush_staged(&mut self, comm: &mut dyn Collective) -> Result<()> {
        if !self.sum_bucket(comm)? {
            return Ok(());
        }
        for p in &self.pieces {
            if let Target::Staged(i) = p.target {
                if let Some(v) = self.reduced[i].as_mut() {
                    v.copy_from_slice(&self.recv[p.at..p.at + p.len]);
                }
            }
        }
        self.pieces.clear();
        self.fill = 0;
        Ok(())
    }

    /// Sums the packed bucket into the receive buffer; false when it is empty.
    fn sum_bucket(&mut self, comm: &mut dyn Collective) -> Result<bool> {
        if self.pieces.is_empty() {
            return Ok(false);
        }
        let n = self.fill;
        sum(
            comm,
            &self.send[..n],
            &mut self.recv[..n],
            &mut self.comm_secs,
        )?;
        Ok(true)
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
        if !self.sum_bucket(comm)? {
            return Ok(());
        }
        for p in &self.pieces {
            let summed = &self.recv[p.at..p.at + p.len];
            match p.target {
                Target::Buffer(i) => {
                    self.sq += write_back(backend, (mem, plan), buffers[i], 0, summed)?;
                }
                Target::Staged(i) => {
                    if let Some(v) = self.reduced[i].as_mut() {
                        v.copy_from_slice(summed);
                    }
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
    Ok(sum_of_squares(values))
}

/// Σ v² in f64, in 8 independent lanes (one chain of dependent adds ran at ~1 value per 4
/// cycles: ~180 ms a step for SmolLM2's 134.5M gradients).
fn sum_of_squares(values: &[f32]) -> f64 {
    let mut lanes = [0f64; 8];
    let mut chunks = values.chunks_exact(8);
    for c in &mut chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f64::from(v) * f64::from(v);
        }
    }
    let rest: f64 = chunks
        .remainder()
        .iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum();
    lanes.iter().sum::<f64>() + rest
}

#[cfg(test)]
mod tests {
    use super::sum_of_squares;

    #[test]
    fn sum_of_squares_matches_a_plain_sum() {
        for n in [0, 1, 7, 8, 9, 1000, 4099] {
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let plain: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
            let lanes = sum_of_squares(&v);
            assert!(
                (lanes - plain).abs() <= 1e-12 * plain.max(1.0),
                "{n}: {lanes} vs {plain}"
            );
        }
        assert!(sum_of_squares(&[1.0, f32::NAN]).is_nan());
    }
}
