//! A model ready to run: a one-token decode plan and one prefill plan (rebuilt when the batch
//! size changes), bound weights, one KV cache and one executor. Prefill runs the prompt in batches of up to `n_batch` tokens; decoding runs
//! the one-token plan. The cache tensors move (without copying) into whichever plan's memory
//! runs next.

use std::collections::HashMap;
use std::sync::Arc;

use tinynn_core::ops::Op;
use tinynn_core::plan::Plan;
use tinynn_cpu::packed::{self, PackedWeight};
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::model_config::ModelConfig;
use tinynn_format::GgmlType;

use crate::llama::{forward_graph_lora, ForwardGraph};
use crate::lora::AppliedLora;
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// One compiled forward pass and its memory.
struct Pass<'m> {
    io: ForwardGraph,
    plan: Plan,
    mem: Memory<'m>,
}

pub struct Session<'m> {
    src: WeightSource<'m>,
    config: ModelConfig,
    n_ctx: usize,
    n_batch: usize,
    passes: Vec<Pass<'m>>,
    /// Prefill passes produce logits for every token (perplexity).
    all_logits: bool,
    cache_type: GgmlType,
    /// Index of the pass whose memory holds the KV cache.
    cache_home: usize,
    exec: Executor,
    n_past: usize,
    logits: Vec<f32>,
    /// Rows in `logits` (1, or the batch size with `all_logits`).
    n_logit_rows: usize,
    mask: Vec<f32>,
    /// Token ids, positions and cache rows of the running batch.
    scratch: [Vec<i32>; 3],
    /// The pass that ran last (for traces).
    last_pass: usize,
    /// Packed copies of matrix weights, shared by every pass (`None`: not packable); empty
    /// when repacking is off.
    packs: Packs,
    /// A LoRA adapter applied to every pass.
    lora: Option<AppliedLora<'m>>,
}

type Packs = Option<HashMap<String, Option<Arc<PackedWeight>>>>;

impl<'m> Session<'m> {
    /// Loads the model in `src` (a GGUF file or an HF directory) with a context of `n_ctx` tokens
    /// (at most the trained one) and prompt batches of up to 512 tokens.
    pub fn new(
        src: impl Into<WeightSource<'m>>,
        n_ctx: usize,
        opts: ExecOptions,
    ) -> Result<Session<'m>> {
        Session::with_all_logits(src, n_ctx, opts, false)
    }

    /// Like [`Session::new`]; with `all_logits`, [`Session::eval_batch`] keeps the logits of
    /// every token of the last batch (see [`Session::all_logits`]).
    pub fn with_all_logits(
        src: impl Into<WeightSource<'m>>,
        n_ctx: usize,
        opts: ExecOptions,
        all_logits: bool,
    ) -> Result<Session<'m>> {
        Session::with_lora(src, n_ctx, opts, all_logits, None)
    }

    /// Like [`Session::with_all_logits`], with a LoRA adapter applied at a scale (checked
    /// against the model: architecture, tensor names and dims).
    pub fn with_lora(
        src: impl Into<WeightSource<'m>>,
        n_ctx: usize,
        opts: ExecOptions,
        all_logits: bool,
        lora: Option<AppliedLora<'m>>,
    ) -> Result<Session<'m>> {
        let src = src.into();
        let config = src.config()?;
        let n_ctx = n_ctx
            .min(config.n_ctx_train.map_or(n_ctx, |c| c as usize))
            .max(1);
        // Strict (reference) runs keep the cache in f32; otherwise F16, as llama.cpp does.
        let cache_type = if opts.strict {
            GgmlType::F32
        } else {
            GgmlType::F16
        };
        let mut packs = (opts.repack && !opts.strict).then(HashMap::new);
        let decode = Session::pass(
            src, lora, &config, n_ctx, 1, true, false, cache_type, &mut packs,
        )?;
        let exec = Executor::with_options(&decode.plan, opts);
        let n_vocab = decode.io.hparams.n_vocab;
        Ok(Session {
            src,
            config,
            n_ctx,
            n_batch: 512.min(n_ctx),
            passes: vec![decode],
            all_logits,
            cache_type,
            cache_home: 0,
            exec,
            n_past: 0,
            logits: vec![0.0; n_vocab],
            n_logit_rows: 1,
            mask: Vec::new(),
            scratch: Default::default(),
            last_pass: 0,
            packs,
            lora,
        })
    }

    /// A compiled pass; only the first (`owns_cache`) allocates the KV cache, the others borrow it.
    /// Weights of matrix products get packed copies (made once, in `packs`) when enabled.
    #[allow(clippy::too_many_arguments)]
    fn pass(
        src: WeightSource<'m>,
        lora: Option<AppliedLora<'m>>,
        config: &ModelConfig,
        n_ctx: usize,
        n_tokens: usize,
        owns_cache: bool,
        all_logits: bool,
        cache_type: GgmlType,
        packs: &mut Packs,
    ) -> Result<Pass<'m>> {
        let io = forward_graph_lora(
            src,
            config,
            n_ctx,
            n_tokens,
            all_logits && n_tokens > 1,
            cache_type,
            lora,
        )?;
        let plan = Plan::compile(io.graph.clone());
        let shared: &[_] = if owns_cache { &[] } else { &io.caches };
        let mut mem = Memory::new_sharing(&plan, shared);
        let matmul_weights: Vec<_> = plan
            .graph()
            .nodes()
            .iter()
            .filter(|n| n.op == Op::MulMat)
            .map(|n| n.src[0])
            .collect();
        for (t, name) in &io.weights {
            // Adapter tensors come from the adapter's file, unpacked (they are small).
            if let Some(data) = lora.and_then(|l| l.adapter.data(name)) {
                mem.bind_weight(&plan, *t, data)?;
                continue;
            }
            let w = src
                .get(name)?
                .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
            mem.bind_weight(&plan, *t, w.data)?;
            let Some(packs) = packs.as_mut().filter(|_| matmul_weights.contains(t)) else {
                continue;
            };
            let layout = plan.graph().layout(*t);
            let p = packs.entry(name.clone()).or_insert_with(|| {
                let p = packed::pack(layout.dtype, layout.ne, w.data).map(Arc::new);
                // The packed copy serves the products; the file's pages can go (an embedding
                // lookup of the same tensor reads its rows back on demand).
                if p.is_some() {
                    src.release(w.data);
                }
                p
            });
            if let Some(p) = p {
                mem.bind_packed(&plan, *t, p.clone())?;
            }
        }
        if let (Some(t), Some(f)) = (io.freq_input, &io.hparams.freq_factors) {
            mem.write_f32(&plan, t, f)?;
        }
        Ok(Pass { io, plan, mem })
    }

    /// The last run's per-step timings as Chrome trace JSON, when the session was made with
    /// `ExecOptions { trace: true, .. }`.
    pub fn chrome_trace(&self) -> Option<String> {
        self.exec
            .chrome_trace(&self.passes[self.last_pass.min(self.passes.len() - 1)].plan)
    }

    /// The decode plan (one token).
    pub fn plan(&self) -> &Plan {
        &self.passes[0].plan
    }

    /// The plan for a batch of `n` tokens, built on first use.
    pub fn plan_for(&mut self, n: usize) -> Result<&Plan> {
        let i = self.pass_index(n)?;
        Ok(&self.passes[i].plan)
    }

    fn pass_index(&mut self, n: usize) -> Result<usize> {
        if let Some(i) = self.passes.iter().position(|p| p.io.n_tokens == n) {
            return Ok(i);
        }
        // Keep the decode pass and one prefill pass: a new batch size replaces the old one.
        if self.passes.len() == 2 {
            self.bring_cache(0)?;
            self.passes.pop();
        }
        let pass = Session::pass(
            self.src,
            self.lora,
            &self.config,
            self.n_ctx,
            n,
            false,
            self.all_logits,
            self.cache_type,
            &mut self.packs,
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

    /// Bytes of the packed weight copies (0 when repacking is off or nothing was packable).
    pub fn packed_bytes(&self) -> usize {
        self.packs
            .iter()
            .flat_map(|m| m.values().flatten())
            .map(|p| p.bytes())
            .sum()
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Largest prompt batch.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    pub fn set_n_batch(&mut self, n: usize) {
        self.n_batch = n.clamp(1, self.n_ctx);
    }

    /// Tokens in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets the cached tokens (their rows are overwritten as new tokens come).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Keeps only the first `n` cached tokens (a conversation that shares a prefix with what
    /// the cache holds continues from there).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
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
            a.mem
                .swap_persistent(&a.plan, ta, &mut b.mem, &b.plan, tb)?;
        }
        self.cache_home = to;
        Ok(())
    }

    /// With `all_logits`: the logits of every token of the last batch, `[n_tokens][n_vocab]`
    /// flat (row i predicts the token after token i).
    pub fn all_logits(&self) -> &[f32] {
        &self.logits
    }

    /// Runs `tokens` at the next positions (in batches) and returns the logits after the last.
    pub fn eval_batch(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        if tokens.is_empty() {
            return Err(ModelError::Invalid("no tokens to evaluate".into()));
        }
        if self.n_past + tokens.len() > self.n_ctx {
            return Err(ModelError::ContextFull(self.n_ctx));
        }
        for chunk in tokens.chunks(self.n_batch) {
            self.run_chunk(chunk)?;
        }
        Ok(self.logits())
    }

    /// The logits after the last evaluated token.
    pub fn logits(&self) -> &[f32] {
        let n_vocab = self.passes[0].io.hparams.n_vocab;
        &self.logits[(self.n_logit_rows - 1) * n_vocab..]
    }

    /// Runs one token at the next position and returns the logits after it.
    pub fn eval(&mut self, token: u32) -> Result<&[f32]> {
        self.eval_batch(&[token])
    }

    fn run_chunk(&mut self, chunk: &[u32]) -> Result<()> {
        let n = chunk.len();
        let i = self.pass_index(n)?;
        self.bring_cache(i)?;
        let start = self.n_past;
        // Inputs go through reused scratch vectors: nothing is allocated per token.
        let [ids, pos, rows] = &mut self.scratch;
        ids.clear();
        for &t in chunk {
            ids.push(
                i32::try_from(t)
                    .map_err(|_| ModelError::Invalid(format!("token id {t} is too large")))?,
            );
        }
        pos.clear();
        pos.extend((start..start + n).map(|p| p as i32));
        let pass = &mut self.passes[i];
        let (n_kv_heads, n_ctx) = (pass.io.hparams.n_head_kv, self.n_ctx);
        rows.clear();
        rows.extend(
            (0..n).flat_map(|t| (0..n_kv_heads).map(move |h| (h * n_ctx + start + t) as i32)),
        );
        pass.mem.write_i32(&pass.plan, pass.io.tokens, ids)?;
        pass.mem.write_i32(&pass.plan, pass.io.pos, pos)?;
        pass.mem
            .write_i32(&pass.plan, pass.io.kv_len, &[(start + n) as i32])?;
        pass.mem.write_i32(&pass.plan, pass.io.kv_rows, rows)?;
        if let Some(mask) = pass.io.mask {
            // Token q (at position start + q) sees cache rows 0..=start + q.
            self.mask.clear();
            for q in 0..n {
                self.mask.extend((0..self.n_ctx).map(|j| {
                    if j <= start + q {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                }));
            }
            pass.mem.write_f32(&pass.plan, mask, &self.mask)?;
        }
        self.exec.run(&pass.plan, &mut pass.mem)?;
        self.last_pass = i;
        self.n_past += n;
        let bytes = self.exec.bytes(&pass.plan, &pass.mem, pass.io.logits)?;
        let n_vocab = pass.io.hparams.n_vocab;
        self.logits.resize(bytes.len() / 4, 0.0);
        for (l, c) in self.logits.iter_mut().zip(bytes.chunks_exact(4)) {
            *l = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        self.n_logit_rows = self.logits.len() / n_vocab;
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
