//! The optimizer step: every micro-batch's grad pass, the data-parallel all-reduce (see
//! `grad_reduce.rs`), the clipping and skip decisions, the update pass.

use tinynn_core::backend::Backend;

use super::{StepReport, Trainer};
use crate::collective::Collective;
use crate::error::{backend_err, Result, TrainError};
use crate::passes::write_labels;
use crate::tensor_io::{scalar, write_i32};

impl<B: Backend> Trainer<B> {
    /// One optimizer step of a data-parallel run, as one rank of `comm`: `ids`/`labels` are
    /// this rank's shard (`accum · batch · seq` values), `norms[k]` is the number of labels
    /// the whole group scores in micro-batch `k` (every rank's shard together; `None`: this
    /// shard's own count), so that each rank's loss and gradient are its share of the group's
    /// mean. The gradient buffers, the loss and `votes` (host values the caller wants summed
    /// across the ranks, e.g. stop requests) are summed over the ranks in place before the
    /// update, and every rank takes the same update: `comm.size()` ranks with batch `b` take
    /// the step one process takes with batch `size · b` on the same sequences (to rounding).
    pub fn step_data_parallel(
        &mut self,
        ids: &[i32],
        labels: &[i32],
        norms: Option<&[f32]>,
        lr: f32,
        votes: &mut [f32],
        comm: &mut dyn Collective,
    ) -> Result<StepReport> {
        self.check_batch(ids, labels, self.cfg.accum)?;
        if !lr.is_finite() {
            return Err(TrainError::Invalid(format!("learning rate {lr}")));
        }
        if norms.is_some_and(|n| n.len() != self.cfg.accum) {
            return Err(TrainError::Batch(format!(
                "{} loss normalizers for {} micro-batches",
                norms.map_or(0, <[f32]>::len),
                self.cfg.accum
            )));
        }
        let n = self.micro_batch_tokens();
        let mut loss_sum = 0f64;
        let mut waited = 0f64;
        let overlap = comm.size() > 1 && self.cfg.overlap_bytes > 0;
        let micro = ids.chunks_exact(n).zip(labels.chunks_exact(n));
        for (k, (ids, labels)) in micro.enumerate() {
            // Each rank draws its own masks from the one shared RNG stream.
            self.draw_dropout(comm.rank() as u64)?;
            let (b, g) = (&mut self.backend, &mut self.grad);
            write_i32(b, (&mut g.mem, &g.plan), g.fwd.tokens, ids)?;
            let n_vocab = self.hparams.n_vocab;
            let norm = norms.map(|n| n[k]);
            write_labels(b, (&mut g.mem, &g.plan), &g.fwd, labels, n_vocab, norm)?;
            let ran = if overlap && k + 1 == self.cfg.accum {
                // The gradients are final after this pass: reduce each as it becomes so.
                let at = (&mut g.mem, &g.plan);
                let limit = self.cfg.overlap_bytes;
                self.reducer.run_overlapped(b, at, &g.buffers, limit, comm)
            } else {
                b.run(&g.plan, &mut g.mem)
                    .map(|()| 0.0)
                    .map_err(backend_err)
            };
            match ran {
                Ok(secs) => waited += secs,
                Err(e) => {
                    self.zero_grads()?;
                    return Err(e);
                }
            }
            let at = (&g.mem, &g.plan);
            loss_sum += f64::from(scalar(b, at, g.fwd.loss, &mut self.scalar)?);
            if self.cfg.trace {
                self.trace = b.trace(&g.plan);
            }
        }
        let grad_sq = if comm.size() > 1 {
            let started = std::time::Instant::now();
            self.votes.clear();
            self.votes.push(loss_sum as f32);
            self.votes.extend_from_slice(votes);
            let g = &mut self.grad;
            let reduced = self.reducer.all_reduce(
                &self.backend,
                (&mut g.mem, &g.plan),
                &g.buffers,
                &mut self.votes,
                comm,
            );
            let sq = match reduced {
                Ok(sq) => sq,
                Err(e) => {
                    self.zero_grads()?;
                    return Err(e);
                }
            };
            loss_sum = f64::from(self.votes[0]);
            votes.copy_from_slice(&self.votes[1..]);
            self.reduce_secs += waited + started.elapsed().as_secs_f64();
            sq as f32
        } else {
            let g = &self.grad;
            scalar(
                &self.backend,
                (&g.mem, &g.plan),
                g.grad_sq,
                &mut self.scalar,
            )?
        };
        let mut loss = (loss_sum / self.cfg.accum as f64) as f32;
        if self.poison > 0 {
            self.poison -= 1;
            loss = f32::NAN;
        }
        let grad_norm = grad_sq.sqrt();
        let skipped = !loss.is_finite() || !grad_norm.is_finite();
        if !skipped {
            let clip = match self.cfg.clip {
                // As torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), at most 1.
                Some(max) => (max / (grad_norm + 1e-6)).min(1.0),
                None => 1.0,
            };
            self.apply_update(lr, clip)?;
        }
        self.zero_grads()?;
        Ok(StepReport {
            loss,
            grad_norm,
            skipped,
            step: self.step,
        })
    }

    /// Seconds data-parallel steps so far have waited for the all-reduce after their backward
    /// passes (0 for one process): its cost in step time, what overlap did not hide.
    pub fn reduce_secs(&self) -> f64 {
        self.reduce_secs
    }

    /// Seconds spent in the collective's sums so far, overlapped with the backward pass or
    /// not (0 for one process).
    pub fn reduce_comm_secs(&self) -> f64 {
        self.reducer.comm_secs
    }
}
