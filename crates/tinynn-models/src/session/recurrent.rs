//! Runs of recurrent models (Mamba), whose sequences keep a state slot each instead of KV
//! cache rows (`crate::common::recurrent`).
//!
//! The scan reads each sequence's tokens in order, so a batch runs as grids of equal-length
//! sequences: every sequence with tokens left advances by the shortest remainder (capped so
//! a grid holds at most `n_batch` tokens) until all are done — a decode step of several
//! sequences is one grid, a prompt next to decoding sequences two. A sequence whose state no
//! longer matches its tokens (it was truncated, or copied from a prefix) first replays its
//! kept tokens from a zero state.

use tinynn_core::backend::Backend;
use tinynn_core::tensor::TensorId;

use super::{backend_err, cell_error, BatchToken, Session};
use crate::kv_cells::CellError;
use crate::{ModelError, Result};

/// One sequence's tokens still to run in a batch.
struct SeqWork {
    seq: usize,
    /// Index in the sequence's tokens of the first token to run.
    start: usize,
    /// Per token from `start`: the output row it fills, if any.
    outputs: Vec<Option<usize>>,
    /// Tokens run so far.
    done: usize,
}

impl<B: Backend> Session<B> {
    /// [`Session::decode`] for a recurrent model.
    pub(super) fn run_recurrent(&mut self, batch: &[BatchToken], hidden: bool) -> Result<()> {
        if batch.is_empty() {
            return Err(ModelError::Invalid("no tokens to evaluate".into()));
        }
        let n_seq = self.cells.n_seq();
        if let Some(t) = batch.iter().find(|t| t.seq >= n_seq) {
            return Err(cell_error(
                CellError::NoSuchSequence(t.seq),
                self.n_ctx,
                n_seq,
            ));
        }
        if let Some(t) = batch.iter().find(|t| i32::try_from(t.token).is_err()) {
            return Err(ModelError::Invalid(format!(
                "token id {} is too large",
                t.token
            )));
        }
        if batch.len() > self.cells.n_free() {
            return Err(ModelError::ContextFull(self.n_ctx));
        }
        self.seq_lens.clear();
        self.seq_lens.extend((0..n_seq).map(|s| self.cells.len(s)));
        self.out.clear();
        let result = self.run_recurrent_inner(batch, hidden);
        if result.is_err() {
            // A grid that failed may have written its sequences' states: rebuild them all.
            for t in batch {
                if let Some(v) = self.state_valid.as_mut() {
                    v[t.seq] = 0;
                }
            }
            for s in 0..self.seq_lens.len() {
                self.truncate_seq(s, self.seq_lens[s]);
            }
            self.out.clear();
        }
        result
    }

    fn run_recurrent_inner(&mut self, batch: &[BatchToken], hidden: bool) -> Result<()> {
        let n_seq = self.cells.n_seq();
        let mut work: Vec<SeqWork> = Vec::new();
        let mut n_flagged = 0;
        for t in batch {
            self.cells
                .push(t.seq)
                .map_err(|e| cell_error(e, self.n_ctx, n_seq))?;
            self.tokens[t.seq].push(t.token);
            let w = match work.iter_mut().position(|w| w.seq == t.seq) {
                Some(i) => &mut work[i],
                None => {
                    let start = self.state_valid.as_ref().map_or(0, |v| v[t.seq]);
                    // Kept tokens the state has not taken in are replayed without outputs.
                    let replay = self.seq_lens[t.seq] - start.min(self.seq_lens[t.seq]);
                    work.push(SeqWork {
                        seq: t.seq,
                        start: start.min(self.seq_lens[t.seq]),
                        outputs: vec![None; replay],
                        done: 0,
                    });
                    work.last_mut().expect("just pushed")
                }
            };
            w.outputs.push(t.logits.then_some(n_flagged));
            n_flagged += usize::from(t.logits);
        }
        loop {
            let active: Vec<usize> = (0..work.len())
                .filter(|&i| work[i].done < work[i].outputs.len())
                .collect();
            let Some(shortest) = active
                .iter()
                .map(|&i| work[i].outputs.len() - work[i].done)
                .min()
            else {
                break;
            };
            for chunk in active.chunks(self.n_batch.max(1)) {
                let n_t = shortest.min((self.n_batch / chunk.len()).max(1));
                self.run_grid(&mut work, chunk, n_t, n_flagged, hidden)?;
            }
        }
        Ok(())
    }

    /// Runs `n_t` tokens of each sequence `work[i]`, `i` in `grid`, as one pass.
    fn run_grid(
        &mut self,
        work: &mut [SeqWork],
        grid: &[usize],
        n_t: usize,
        n_flagged: usize,
        hidden: bool,
    ) -> Result<()> {
        let n_s = grid.len();
        let n = n_t * n_s;
        let [ids, slots, _, outs, places] = &mut self.scratch;
        ids.clear();
        slots.clear();
        outs.clear();
        places.clear();
        self.grid_f32[0].clear();
        let valid = self.state_valid.as_ref().expect("a recurrent session");
        for (si, &wi) in grid.iter().enumerate() {
            let w = &work[wi];
            let from = w.start + w.done;
            for k in 0..n_t {
                ids.push(self.tokens[w.seq][from + k] as i32);
                if let Some(place) = w.outputs[w.done + k] {
                    outs.push((si * n_t + k) as i32);
                    places.push(place as i32);
                }
            }
            slots.push(w.seq as i32);
            self.grid_f32[0].push(if valid[w.seq] > 0 { 1.0f32 } else { 0.0 });
        }
        let flagged = outs.len();
        if outs.is_empty() {
            outs.push(n as i32 - 1);
        }
        let n_out = outs.len();
        let i = self.pass_index_grid(n, n_s, n_out, hidden)?;
        self.bring_cache(i)?;
        self.runs += 1;
        let pass = &mut self.passes[i];
        pass.last_used = self.runs;
        let (backend, buf) = (&self.backend, &mut self.bytes);
        let mut put = |t: TensorId, vals: &mut dyn Iterator<Item = [u8; 4]>| {
            buf.clear();
            vals.for_each(|v| buf.extend_from_slice(&v));
            backend
                .write(&mut pass.mem, &pass.plan, t, 0, buf)
                .map_err(backend_err)
        };
        let [ids, slots, _, outs, places] = &self.scratch;
        let keep = &self.grid_f32[0];
        let io = &pass.io;
        put(io.tokens, &mut ids.iter().map(|v| v.to_le_bytes()))?;
        let missing = || ModelError::Invalid("a recurrent pass without its state inputs".into());
        put(
            io.state_slots.ok_or_else(missing)?,
            &mut slots.iter().map(|v| v.to_le_bytes()),
        )?;
        put(
            io.state_keep.ok_or_else(missing)?,
            &mut keep.iter().map(|v| v.to_le_bytes()),
        )?;
        if let Some(t) = io.out_ids {
            put(t, &mut outs.iter().map(|v| v.to_le_bytes()))?;
        }
        self.backend
            .run(&pass.plan, &mut pass.mem)
            .map_err(backend_err)?;
        self.last_pass = i;
        let rows = &mut self.grid_f32[1];
        rows.clear();
        self.backend
            .read_f32(&pass.plan, &pass.mem, pass.io.output, rows)
            .map_err(backend_err)?;
        let row_len = rows.len() / n_out;
        self.row_len = row_len;
        if flagged > 0 {
            self.out.resize(n_flagged * row_len, 0.0);
            for (r, &place) in places.iter().enumerate() {
                let p = place as usize;
                self.out[p * row_len..(p + 1) * row_len]
                    .copy_from_slice(&rows[r * row_len..(r + 1) * row_len]);
            }
        }
        let valid = self.state_valid.as_mut().expect("a recurrent session");
        for &wi in grid {
            let w = &mut work[wi];
            w.done += n_t;
            valid[w.seq] = w.start + w.done;
        }
        Ok(())
    }

    /// A recurrent model: sequence `dst` (holding the first `n` tokens of `src`) takes `src`'s
    /// state when that state is of exactly those tokens, else rebuilds its own on its next
    /// run. Attention models: nothing to do.
    pub(super) fn copy_state(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        let Some(valid) = self.state_valid.as_ref() else {
            return Ok(());
        };
        let exact = n > 0 && valid[src] == n && self.tokens[src].len() == n;
        if !exact {
            self.state_valid.as_mut().expect("checked")[dst] = 0;
            return Ok(());
        }
        let pass = &mut self.passes[self.cache_home];
        let mut table = Vec::new();
        for &t in &pass.io.caches {
            let col = pass.plan.graph().layout(t).ne[0];
            self.backend
                .read_f32(&pass.plan, &pass.mem, t, &mut table)
                .map_err(backend_err)?;
            let bytes: Vec<u8> = table[src * col..(src + 1) * col]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            self.backend
                .write(&mut pass.mem, &pass.plan, t, dst * col * 4, &bytes)
                .map_err(backend_err)?;
            table.clear();
        }
        self.state_valid.as_mut().expect("checked")[dst] = n;
        Ok(())
    }
}
