//! A model ready to run: its decode plan, bound weights, KV cache and executor.

use tinynn_core::plan::Plan;
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::gguf::GgufFile;
use tinynn_format::model_config::ModelConfig;

use crate::llama::{decode_graph, DecodeGraph};
use crate::{ModelError, Result};

pub struct Session<'m> {
    io: DecodeGraph,
    plan: Plan,
    mem: Memory<'m>,
    exec: Executor,
    n_past: usize,
    logits: Vec<f32>,
}

impl<'m> Session<'m> {
    /// Builds, plans and binds the model in `file` with a context of `n_ctx` tokens.
    pub fn new(file: &'m GgufFile, n_ctx: usize, opts: ExecOptions) -> Result<Session<'m>> {
        let config = ModelConfig::from_gguf(file.gguf())?;
        let n_ctx = n_ctx.min(config.n_ctx_train.map_or(n_ctx, |c| c as usize));
        let io = decode_graph(file, &config, n_ctx)?;
        let plan = Plan::compile(io.graph.clone());
        let mut mem = Memory::new(&plan);
        for (t, name) in &io.weights {
            let view = file
                .tensor(name)
                .ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
            mem.bind_weight(&plan, *t, view.data)?;
        }
        let exec = Executor::with_options(&plan, opts);
        let n_vocab = io.hparams.n_vocab;
        Ok(Session {
            io,
            plan,
            mem,
            exec,
            n_past: 0,
            logits: vec![0.0; n_vocab],
        })
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub fn n_ctx(&self) -> usize {
        self.io.n_ctx
    }

    /// Tokens in the cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Forgets the cached tokens (the cache rows are overwritten as new tokens come).
    pub fn reset(&mut self) {
        self.n_past = 0;
    }

    /// Runs `token` at the next position and returns the logits for the token after it.
    pub fn eval(&mut self, token: u32) -> Result<&[f32]> {
        if self.n_past >= self.io.n_ctx {
            return Err(ModelError::ContextFull(self.io.n_ctx));
        }
        let pos = self.n_past as i32;
        let token = i32::try_from(token)
            .map_err(|_| ModelError::Invalid(format!("token id {token} is too large")))?;
        self.mem.write_i32(&self.plan, self.io.token, &[token])?;
        self.mem.write_i32(&self.plan, self.io.pos, &[pos])?;
        self.mem.write_i32(&self.plan, self.io.kv_len, &[pos + 1])?;
        self.exec.run(&self.plan, &mut self.mem)?;
        self.n_past += 1;
        let bytes = self.exec.bytes(&self.plan, &self.mem, self.io.logits)?;
        for (l, c) in self.logits.iter_mut().zip(bytes.chunks_exact(4)) {
            *l = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        Ok(&self.logits)
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
