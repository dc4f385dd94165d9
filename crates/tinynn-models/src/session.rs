//! A model ready to run: an owned [`Model`], one KV cache shared by up to `n_seq` sequences
//! (see [`crate::kv_cells`]), compiled forward passes and one executor.
//!
//! A run takes a ragged batch of tokens, each appended to its own sequence
//! ([`Session::decode`]): prompts of some sequences and the next tokens of others go through
//! one plan run, so the weights are read once for all of them. Passes are compiled per
//! (tokens, outputs) shape on first use and kept (the one-token pass always, a few others by
//! recent use); the cache tensors move between their memories without copying.
//!
//! The one-sequence calls ([`Session::eval_batch`], [`Session::eval`], [`Session::n_past`],
//! [`Session::truncate`], [`Session::reset`]) work on sequence 0.

#![warn(missing_docs)]

mod recurrent;

use std::sync::Arc;

use tinynn_core::backend::{Backend, WeightRef, WeightStore};
use tinynn_core::ops::Op;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{ExecOptions, Executor};
use tinynn_format::GgmlType;

use crate::kv_cells::{CellError, KvCells, MAX_SEQUENCES};
use crate::llama::{forward_graph, ForwardGraph, GraphSpec};
use crate::lora::AppliedLora;
use crate::model::Model;
use crate::{ModelError, Result};

/// How a session is made.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// KV cache rows (tokens) shared by all sequences; at most the model's trained context.
    pub n_ctx: usize,
    /// Sequences the cache holds (1 to 64).
    pub n_seq: usize,
    /// Most tokens per plan run (longer batches run in pieces).
    pub n_batch: usize,
    /// Threads, strict mode, repacking, tracing. `strict` (f32 cache, no packed weights) and
    /// `repack` hold for any backend; the rest configure the default CPU backend.
    pub exec: ExecOptions,
    /// With `all_logits`, [`Session::eval_batch`] keeps the logits of every token (perplexity).
    pub all_logits: bool,
    /// LoRA adapters applied to every pass (their branches add up; llama.cpp's repeated
    /// `--lora`).
    pub lora: Vec<AppliedLora>,
}

impl Default for SessionOptions {
    fn default() -> SessionOptions {
        SessionOptions {
            n_ctx: 4096,
            n_seq: 1,
            n_batch: 512,
            exec: ExecOptions::default(),
            all_logits: false,
            lora: Vec::new(),
        }
    }
}

impl SessionOptions {
    /// One sequence with a context of `n_ctx` tokens.
    pub fn new(n_ctx: usize, exec: ExecOptions) -> SessionOptions {
        SessionOptions {
            n_ctx,
            exec,
            ..SessionOptions::default()
        }
    }
}

/// One token of a batch: appended to sequence `seq`; `logits` asks for its output row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    /// The token id.
    pub token: u32,
    /// The sequence it is appended to (`0..n_seq`).
    pub seq: usize,
    /// Whether the run outputs its logits (see [`Session::output`]).
    pub logits: bool,
}

impl BatchToken {
    /// `tokens` appended to sequence `seq`, with output rows for all of them (`all`) or for
    /// the last only (a prompt whose continuation is sampled).
    pub fn sequence(
        tokens: &[u32],
        seq: usize,
        all: bool,
    ) -> impl Iterator<Item = BatchToken> + '_ {
        let last = tokens.len().saturating_sub(1);
        tokens
            .iter()
            .enumerate()
            .map(move |(i, &token)| BatchToken {
                token,
                seq,
                logits: all || i == last,
            })
    }

    /// One token for each sequence: `tokens[s]` goes to sequence `s`, every one with its
    /// output row (a decode step of several sequences).
    pub fn one_each(tokens: &[u32]) -> impl Iterator<Item = BatchToken> + '_ {
        tokens.iter().enumerate().map(|(seq, &token)| BatchToken {
            token,
            seq,
            logits: true,
        })
    }
}

/// One compiled forward pass and its memory.
struct Pass<B: Backend> {
    io: ForwardGraph,
    plan: Plan,
    mem: B::Memory,
    /// Run counter at its last use (passes other than the first are dropped least recent first).
    last_used: u64,
}

/// Passes kept besides the one-token pass.
const MAX_EXTRA_PASSES: usize = 4;

/// A model with its KV cache, passes and backend (see the module docs); the CPU backend
/// unless made with [`Session::with_backend`].
pub struct Session<B: Backend = Executor> {
    model: Arc<Model>,
    opts: SessionOptions,
    n_ctx: usize,
    n_batch: usize,
    passes: Vec<Pass<B>>,
    cache_type: GgmlType,
    /// Index of the pass whose memory holds the KV cache.
    cache_home: usize,
    backend: B,
    cells: KvCells,
    /// Per sequence: the tokens whose K/V the cache holds, in order.
    tokens: Vec<Vec<u32>>,
    /// Output rows of the last `decode` call, `[n_out][row_len]` flat.
    pub(crate) out: Vec<f32>,
    /// Length of one output row (the vocabulary, or the embedding size).
    pub(crate) row_len: usize,
    /// Inputs of the running piece, reused: token ids, positions, cache rows, output rows,
    /// cells taken.
    scratch: [Vec<i32>; 5],
    /// Each sequence's length before the running batch (to roll a failed batch back).
    seq_lens: Vec<usize>,
    /// Bytes on their way to the backend.
    bytes: Vec<u8>,
    runs: u64,
    /// The pass that ran last (for traces).
    last_pass: usize,
    /// A recurrent model (Mamba): per sequence, how many of its tokens its state slot has
    /// taken in (less than its length after a truncation, when the state must be rebuilt:
    /// the next run replays the kept tokens first). `None` for attention models.
    state_valid: Option<Vec<usize>>,
    /// A recurrent run's reused buffers: the grid's keep flags and its output rows.
    grid_f32: [Vec<f32>; 2],
}

/// The error of a cache of `n_ctx` rows and `n_seq` sequences that could not take a token.
fn cell_error(e: CellError, n_ctx: usize, n_seq: usize) -> ModelError {
    match e {
        CellError::Full => ModelError::ContextFull(n_ctx),
        CellError::NoSuchSequence(s) => ModelError::Invalid(format!(
            "sequence {s} does not exist (the session holds {n_seq})"
        )),
    }
}

fn backend_err<E: std::error::Error + Send + Sync + 'static>(e: E) -> ModelError {
    ModelError::Backend(Box::new(e))
}

impl Session {
    /// A session over `model` with a context of `n_ctx` tokens (one sequence), on the CPU.
    pub fn new(model: Arc<Model>, n_ctx: usize, exec: ExecOptions) -> Result<Session> {
        Session::with_options(model, SessionOptions::new(n_ctx, exec))
    }

    /// A session as `opts` says, on the CPU backend.
    pub fn with_options(model: Arc<Model>, opts: SessionOptions) -> Result<Session> {
        let cpu = Executor::cpu(opts.exec);
        Session::with_backend(model, opts, cpu)
    }
}

impl<B: Backend> Session<B> {
    /// A session as `opts` says, on `backend`.
    pub fn with_backend(model: Arc<Model>, opts: SessionOptions, backend: B) -> Result<Session<B>> {
        let config = model.config();
        let n_ctx = opts
            .n_ctx
            .min(config.n_ctx_train.map_or(opts.n_ctx, |c| c as usize))
            .max(1);
        if opts.n_seq == 0 || opts.n_seq > MAX_SEQUENCES {
            return Err(ModelError::Invalid(format!(
                "{} sequences: a session holds 1 to {MAX_SEQUENCES}",
                opts.n_seq
            )));
        }
        // Strict (reference) runs keep the cache in f32; otherwise F16, as llama.cpp does.
        let cache_type = if opts.exec.strict {
            GgmlType::F32
        } else {
            GgmlType::F16
        };
        let spec = GraphSpec {
            n_cells: n_ctx,
            n_tokens: 1,
            n_out: 1,
            cache_type,
            masked: opts.n_seq > 1,
            hidden: false,
            n_slots: opts.n_seq,
            n_seqs: 1,
        };
        let decode = Session::build_pass(&backend, &model, &opts, spec, true, 0)?;
        let row_len = decode.io.hparams.n_vocab;
        let state_valid = decode.io.hparams.ssm.map(|_| vec![0; opts.n_seq]);
        Ok(Session {
            n_ctx,
            n_batch: opts.n_batch.clamp(1, n_ctx),
            cache_type,
            cache_home: 0,
            backend,
            bytes: Vec::new(),
            passes: vec![decode],
            cells: KvCells::new(n_ctx, opts.n_seq),
            tokens: vec![Vec::new(); opts.n_seq],
            out: vec![0.0; row_len],
            row_len,
            scratch: Default::default(),
            seq_lens: Vec::with_capacity(opts.n_seq),
            runs: 0,
            last_pass: 0,
            state_valid,
            grid_f32: Default::default(),
            model,
            opts,
        })
    }

    /// The model this session runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// A compiled pass; only the first allocates the KV cache, the others borrow it. Weights
    /// of matrix products read the model's packed copies when repacking is on.
    fn build_pass(
        backend: &B,
        model: &Arc<Model>,
        opts: &SessionOptions,
        spec: GraphSpec,
        owns_cache: bool,
        runs: u64,
    ) -> Result<Pass<B>> {
        let src = model.source();
        let lora = &opts.lora;
        let io = forward_graph(src, model.config(), spec, lora)?;
        let plan = backend.compile(io.graph.clone());
        let shared: &[_] = if owns_cache { &[] } else { &io.caches };
        let mut mem = backend.new_memory(&plan, shared).map_err(backend_err)?;
        let matmul_weights: Vec<_> = plan
            .graph()
            .nodes()
            .iter()
            .filter(|n| n.op == Op::MulMat)
            .map(|n| n.src[0])
            .collect();
        let repack = opts.exec.repack && !opts.exec.strict;
        let store: Arc<dyn WeightStore> = model.clone();
        for (t, name) in &io.weights {
            // Adapter tensors come from the adapter's file, unpacked (they are small).
            if let Some((i, tensor)) = crate::forward::leaves::adapter_tensor(name) {
                let l = &lora[i];
                if let Some(range) = l.adapter.range(tensor) {
                    let store: Arc<dyn WeightStore> = l.adapter.clone();
                    let w = WeightRef {
                        store,
                        region: 0,
                        range,
                    };
                    backend
                        .bind_weight(&mut mem, &plan, *t, w)
                        .map_err(backend_err)?;
                    continue;
                }
            }
            let w = src
                .get(name)?
                .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
            let (region, range) = model.locate(w.data).ok_or_else(|| {
                ModelError::Invalid(format!("'{name}' lies outside the model's files"))
            })?;
            let weight = WeightRef {
                store: store.clone(),
                region,
                range,
            };
            backend
                .bind_weight(&mut mem, &plan, *t, weight)
                .map_err(backend_err)?;
            if repack && matmul_weights.contains(t) {
                let layout = plan.graph().layout(*t);
                if let Some(p) = model.packed(backend, name, layout.dtype, layout.ne, w.data) {
                    backend
                        .bind_packed(&mut mem, &plan, *t, p)
                        .map_err(backend_err)?;
                }
            }
        }
        if let (Some(t), Some(f)) = (io.freq_input, &io.hparams.freq_factors) {
            let bytes: Vec<u8> = f.iter().flat_map(|x| x.to_le_bytes()).collect();
            backend
                .write(&mut mem, &plan, t, 0, &bytes)
                .map_err(backend_err)?;
        }
        Ok(Pass {
            io,
            plan,
            mem,
            last_used: runs,
        })
    }

    /// The last run's per-step timings as Chrome trace JSON, when the session was made with
    /// `ExecOptions { trace: true, .. }`.
    pub fn chrome_trace(&self) -> Option<String> {
        self.backend
            .trace(&self.passes[self.last_pass.min(self.passes.len() - 1)].plan)
    }

    /// The decode plan (one token).
    pub fn plan(&self) -> &Plan {
        &self.passes[0].plan
    }

    /// The plan for a batch of `n` tokens of one sequence (last token's logits), built on first
    /// use.
    pub fn plan_for(&mut self, n: usize) -> Result<&Plan> {
        let i = self.pass_index(n, 1, false)?;
        Ok(&self.passes[i].plan)
    }

    fn pass_index(&mut self, n: usize, n_out: usize, hidden: bool) -> Result<usize> {
        self.pass_index_grid(n, 1, n_out, hidden)
    }

    /// The pass for `n` tokens in `n_seqs` equal sequences (recurrent models; 1 otherwise).
    fn pass_index_grid(
        &mut self,
        n: usize,
        n_seqs: usize,
        n_out: usize,
        hidden: bool,
    ) -> Result<usize> {
        let spec = GraphSpec {
            n_cells: self.n_ctx,
            n_tokens: n,
            n_out,
            cache_type: self.cache_type,
            masked: self.opts.n_seq > 1,
            hidden,
            n_slots: self.opts.n_seq,
            n_seqs,
        };
        if let Some(i) = self.passes.iter().position(|p| p.io.spec == spec) {
            return Ok(i);
        }
        if self.passes.len() > MAX_EXTRA_PASSES {
            let (oldest, _) = self.passes[1..]
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map(|(i, p)| (i + 1, p.last_used))
                .unwrap_or((1, 0));
            self.bring_cache(0)?;
            self.passes.remove(oldest);
        }
        let pass = Session::build_pass(
            &self.backend,
            &self.model,
            &self.opts,
            spec,
            false,
            self.runs,
        )?;
        self.passes.push(pass);
        Ok(self.passes.len() - 1)
    }

    /// Bytes of the KV cache.
    pub fn kv_cache_bytes(&self) -> usize {
        let p = &self.passes[0];
        p.io.caches
            .iter()
            .map(|&t| p.plan.graph().layout(t).contiguous_bytes())
            .sum()
    }

    /// Bytes of the model's packed weight copies (0 when repacking is off or nothing was
    /// packable); shared by every session of the model.
    pub fn packed_bytes(&self) -> usize {
        self.model.packed_bytes()
    }

    /// KV cache rows, shared by all sequences.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Sequences the cache holds.
    pub fn n_seq(&self) -> usize {
        self.cells.n_seq()
    }

    /// Largest batch per plan run.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Sets the largest batch per plan run (at least 1, at most `n_ctx`).
    pub fn set_n_batch(&mut self, n: usize) {
        self.n_batch = n.clamp(1, self.n_ctx);
    }

    /// Cache rows no sequence holds.
    pub fn n_free(&self) -> usize {
        self.cells.n_free()
    }

    /// Tokens sequence 0 holds.
    pub fn n_past(&self) -> usize {
        self.cells.len(0)
    }

    /// Forgets sequence 0's tokens.
    pub fn reset(&mut self) {
        self.clear_seq(0);
    }

    /// Keeps only the first `n` tokens of sequence 0 (a conversation that shares a prefix with
    /// what the cache holds continues from there).
    pub fn truncate(&mut self, n: usize) {
        self.truncate_seq(0, n);
    }

    /// Tokens sequence `seq` holds.
    pub fn seq_len(&self, seq: usize) -> usize {
        self.cells.len(seq)
    }

    /// The tokens sequence `seq` holds, in order.
    pub fn seq_tokens(&self, seq: usize) -> &[u32] {
        self.tokens.get(seq).map_or(&[], Vec::as_slice)
    }

    /// Keeps the first `n` tokens of sequence `seq`; the rest of its cache rows are freed.
    /// A recurrent model's state cannot be cut back: it is rebuilt from the kept tokens by
    /// the sequence's next run.
    pub fn truncate_seq(&mut self, seq: usize, n: usize) {
        self.cells.truncate(seq, n);
        if let Some(t) = self.tokens.get_mut(seq) {
            t.truncate(n);
        }
        if let Some(v) = self.state_valid.as_mut().and_then(|v| v.get_mut(seq)) {
            if *v > n {
                *v = 0;
            }
        }
    }

    /// Forgets every token of sequence `seq`.
    pub fn clear_seq(&mut self, seq: usize) {
        self.truncate_seq(seq, 0);
    }

    /// Makes the first `n` tokens of sequence `src` the start of sequence `dst` as well (a shared
    /// prompt prefix: the rows are shared, not copied); `dst`'s own tokens are dropped first.
    pub fn copy_seq(&mut self, src: usize, dst: usize, n: usize) -> Result<()> {
        self.cells
            .copy_prefix(src, dst, n)
            .map_err(|e| cell_error(e, self.n_ctx, self.cells.n_seq()))?;
        if src != dst {
            let n = n.min(self.tokens[src].len());
            self.tokens[dst] = self.tokens[src][..n].to_vec();
            self.copy_state(src, dst, n)?;
        }
        Ok(())
    }

    /// Moves the KV cache into pass `to`'s memory.
    fn bring_cache(&mut self, to: usize) -> Result<()> {
        if to == self.cache_home {
            return Ok(());
        }
        let (a, b) = if to < self.cache_home {
            let (lo, hi) = self.passes.split_at_mut(self.cache_home);
            (&mut lo[to], &mut hi[0])
        } else {
            let (lo, hi) = self.passes.split_at_mut(to);
            (&mut hi[0], &mut lo[self.cache_home])
        };
        for (&ta, &tb) in a.io.caches.iter().zip(&b.io.caches) {
            self.backend
                .swap(&mut a.mem, &a.plan, ta, &mut b.mem, &b.plan, tb)
                .map_err(backend_err)?;
        }
        self.cache_home = to;
        Ok(())
    }

    /// With `all_logits`: the logits of every token of the last [`Session::eval_batch`],
    /// `[n_tokens][n_vocab]` flat (row i predicts the token after token i).
    pub fn all_logits(&self) -> &[f32] {
        &self.out
    }

    /// Runs `tokens` at the next positions of sequence 0 (in batches) and returns the logits
    /// after the last.
    pub fn eval_batch(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(ModelError::Invalid("no tokens to evaluate".into()));
        }
        let batch: Vec<BatchToken> =
            BatchToken::sequence(tokens, 0, self.opts.all_logits).collect();
        self.decode(&batch)?;
        Ok(self.logits())
    }

    /// Runs one token at the next position of sequence 0 and returns the logits after it.
    pub fn eval(&mut self, token: u32) -> Result<&[f32]> {
        self.decode(&[BatchToken {
            token,
            seq: 0,
            logits: true,
        }])?;
        Ok(self.logits())
    }

    /// The last output row of the last run (the logits after its last flagged token).
    pub fn logits(&self) -> &[f32] {
        let n = self.n_outputs();
        self.output(n.saturating_sub(1))
    }

    /// Output rows of the last [`Session::decode`] (one per flagged token, in batch order).
    pub fn n_outputs(&self) -> usize {
        self.out.len() / self.row_len.max(1)
    }

    /// Output row `i` of the last [`Session::decode`]: the logits after the i-th flagged token.
    pub fn output(&self, i: usize) -> &[f32] {
        let r = self.row_len;
        self.out.get(i * r..(i + 1) * r).unwrap_or_default()
    }

    /// Appends each token of `batch` to its sequence and runs them together (in pieces of at
    /// most `n_batch` tokens); the tokens with `logits` set get output rows
    /// ([`Session::output`]). Nothing changes when it fails: a batch that does not fit the
    /// free cache rows, names a missing sequence or holds a bad token id leaves every sequence
    /// as it was.
    pub fn decode(&mut self, batch: &[BatchToken]) -> Result<()> {
        self.run_batch(batch, false)
    }

    pub(crate) fn run_batch(&mut self, batch: &[BatchToken], hidden: bool) -> Result<()> {
        if self.state_valid.is_some() {
            return self.run_recurrent(batch, hidden);
        }
        if batch.is_empty() {
            return Err(ModelError::Invalid("no tokens to evaluate".into()));
        }
        if let Some(t) = batch.iter().find(|t| t.seq >= self.cells.n_seq()) {
            return Err(cell_error(
                CellError::NoSuchSequence(t.seq),
                self.n_ctx,
                self.cells.n_seq(),
            ));
        }
        if batch.len() > self.cells.n_free() {
            return Err(ModelError::ContextFull(self.n_ctx));
        }
        // Nothing is allocated per batch: the inputs go through reused scratch vectors.
        self.seq_lens.clear();
        self.seq_lens
            .extend((0..self.cells.n_seq()).map(|s| self.cells.len(s)));
        self.out.clear();
        let n_batch = self.n_batch;
        for piece in batch.chunks(n_batch) {
            if let Err(e) = self.run_piece(piece, hidden) {
                for s in 0..self.seq_lens.len() {
                    self.truncate_seq(s, self.seq_lens[s]);
                }
                self.out.clear();
                return Err(e);
            }
        }
        Ok(())
    }

    fn run_piece(&mut self, piece: &[BatchToken], hidden: bool) -> Result<()> {
        let n = piece.len();
        let flagged = piece.iter().filter(|t| t.logits).count();
        // A piece without flagged tokens still outputs one row (discarded).
        let n_out = flagged.max(1);
        let i = self.pass_index(n, n_out, hidden)?;
        self.bring_cache(i)?;
        self.runs += 1;
        let [ids, pos, rows, outs, cells] = &mut self.scratch;
        ids.clear();
        pos.clear();
        outs.clear();
        cells.clear();
        for (k, t) in piece.iter().enumerate() {
            ids.push(
                i32::try_from(t.token).map_err(|_| {
                    ModelError::Invalid(format!("token id {} is too large", t.token))
                })?,
            );
            pos.push(self.cells.len(t.seq) as i32);
            let n_seq = self.cells.n_seq();
            let cell = self
                .cells
                .push(t.seq)
                .map_err(|e| cell_error(e, self.n_ctx, n_seq))?;
            self.tokens[t.seq].push(t.token);
            cells.push(cell as i32);
            if t.logits {
                outs.push(k as i32);
            }
        }
        if outs.is_empty() {
            outs.push(n as i32 - 1);
        }
        let pass = &mut self.passes[i];
        pass.last_used = self.runs;
        let (n_kv_heads, n_cells) = (pass.io.hparams.n_head_kv, self.n_ctx);
        rows.clear();
        rows.extend(
            cells
                .iter()
                .flat_map(|&c| (0..n_kv_heads).map(move |h| (h * n_cells) as i32 + c)),
        );
        let kv_len = self.cells.used_end();
        let (backend, buf) = (&self.backend, &mut self.bytes);
        let mut put = |t: TensorId, offset: usize, vals: &mut dyn Iterator<Item = [u8; 4]>| {
            buf.clear();
            vals.for_each(|v| buf.extend_from_slice(&v));
            backend
                .write(&mut pass.mem, &pass.plan, t, offset, buf)
                .map_err(backend_err)
        };
        let io = &pass.io;
        put(io.tokens, 0, &mut ids.iter().map(|v| v.to_le_bytes()))?;
        put(io.pos, 0, &mut pos.iter().map(|v| v.to_le_bytes()))?;
        put(
            io.kv_len,
            0,
            &mut std::iter::once((kv_len as i32).to_le_bytes()),
        )?;
        put(io.kv_rows, 0, &mut rows.iter().map(|v| v.to_le_bytes()))?;
        if let Some(t) = io.out_ids {
            put(t, 0, &mut outs.iter().map(|v| v.to_le_bytes()))?;
        }
        // Row q: 0 where token q may attend to cache row j, -inf elsewhere (rows from kv_len
        // on are never read); the window layers' mask also hides rows `window` or more
        // positions back.
        let window = io.hparams.swa.as_ref().map(|s| s.window);
        for (mask, window) in [(io.mask, None), (io.mask_swa, window)] {
            let Some(mask) = mask else { continue };
            let cells = &self.cells;
            for (q, t) in piece.iter().enumerate() {
                let p = pos[q] as usize;
                let mut row = (0..kv_len).map(|j| {
                    let visible = cells.visible_within(j, t.seq, p, window);
                    if visible { 0.0f32 } else { f32::NEG_INFINITY }.to_le_bytes()
                });
                put(mask, q * n_cells * 4, &mut row)?;
            }
        }
        self.backend
            .run(&pass.plan, &mut pass.mem)
            .map_err(backend_err)?;
        self.last_pass = i;
        let before = self.out.len();
        self.backend
            .read_f32(&pass.plan, &pass.mem, pass.io.output, &mut self.out)
            .map_err(backend_err)?;
        self.row_len = (self.out.len() - before) / n_out;
        if flagged == 0 {
            self.out.truncate(before);
        }
        Ok(())
    }
}

/// The index of the largest logit (the first on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    /// Front ends move sessions between threads (a server's engine thread, Python) and share
    /// models across them.
    #[test]
    fn sessions_are_send_and_models_are_shared() {
        fn send<T: Send>() {}
        fn send_sync<T: Send + Sync>() {}
        send::<super::Session>();
        send_sync::<crate::model::Model>();
        send_sync::<crate::lora::LoraAdapter>();
    }
}
