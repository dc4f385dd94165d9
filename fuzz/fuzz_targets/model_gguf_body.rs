//! "A valid file with hostile hyperparameters": fuzz bytes steer a generator that writes a
//! well-formed GGUF model — an architecture of the registry, its metadata keys (true, absent, or
//! lying: zero, huge, not dividing, off by one), the tensors its decoder declares for a small
//! true shape (some dropped, some reshaped, each F32, F16, Q8_0 or Q4_0 with fuzz-chosen bytes,
//! NaN scales included), sometimes a vocabulary — then opens it and decodes a token. Every
//! outcome must be a value or an error; shared by the `model_gguf` fuzz target and
//! `tinynn-models/tests/fuzz_model_gguf.rs`, which replays its corpus.

use std::sync::Arc;

use tinynn_format::gguf::{Array, GgufString, GgufWriter, Value};
use tinynn_format::model_config::{
    Architecture, AttentionExtras, Experts, ModelConfig, RopeScaling, Ssm,
};
use tinynn_format::GgmlType;
use tinynn_models::arch::{self, Hparams};
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};

/// Reads the fuzz input a little at a time; past its end every read is 0.
struct Input<'a> {
    data: &'a [u8],
    at: usize,
}

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn bit(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    fn below(&mut self, n: usize) -> usize {
        self.u8() as usize % n.max(1)
    }

    /// `truth`, or (one time in four) a hostile stand-in for it.
    fn lie(&mut self, truth: u64) -> u64 {
        match self.u8() % 16 {
            0 => 0,
            1 => truth + 1,
            2 => truth.saturating_sub(1),
            3 => u32::MAX as u64,
            4 => self.u32() as u64,
            5 => 1 << 40,
            _ => truth,
        }
    }
}

const ARCHS: [&str; 11] = [
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3", "gpt2", "gptneox", "phi3",
    "mamba",
];

/// The model file the input describes, or `None` when the writer refuses it.
pub fn model_file(data: &[u8]) -> Option<Vec<u8>> {
    let mut u = Input { data, at: 0 };
    let name = ARCHS[u.below(ARCHS.len())];
    // The true (small) shape the tensors are made for.
    let n_head = 1 + u.below(4) as u64;
    let n_head_kv = if u.bit() { n_head } else { 1 };
    let head_dim = 2 * (1 + u.below(8) as u64);
    let n_embd = n_head * head_dim;
    let n_layer = 1 + u.below(3) as u64;
    let n_ff = 1 + u.below(64) as u64;
    let n_vocab = 1 + u.below(64) as u64;
    let experts = (name == "llama" && u.bit()).then(|| Experts {
        count: 2 + u.below(4) as u64,
        used: 1 + u.below(2) as u64,
    });
    let ssm = (name == "mamba").then(|| Ssm {
        conv_kernel: 2 + u.below(4) as u64,
        inner_size: 1 + u.below(16) as u64,
        state_size: 1 + u.below(8) as u64,
        time_step_rank: 1 + u.below(4) as u64,
    });
    let (n_head, n_head_kv, head_dim) = match ssm {
        Some(_) => (0, 0, 0),
        None => (n_head, n_head_kv, head_dim),
    };
    let config = ModelConfig {
        architecture: Architecture::from_gguf_name(name),
        n_vocab: Some(n_vocab),
        n_ctx_train: Some(64),
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff: Some(n_ff),
        norm_eps: Some(1e-5),
        rope_dims: None,
        rope_freq_base: Some(10_000.0),
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: Some(u.bit()),
        parallel_residual: None,
        attn: AttentionExtras {
            sliding_window: u.bit().then_some(4),
            ..AttentionExtras::default()
        },
        experts,
        ssm,
    };
    let a = arch::by_name(name)?;
    let hp = Hparams::from_config(&config, false).ok()?;
    let keep_optional = u.u32();
    let has = |t: &str| Ok(a.decoder.fresh_has(&config, t) || keep_optional & 1 == 1);
    let decls = arch::declare(a.decoder, &hp, &has).ok()?;

    let mut w = GgufWriter::new();
    w.set_str("general.architecture", name);
    let k = |s: &str| format!("{name}.{s}");
    let set = |w: &mut GgufWriter<'_>, key: String, v: u64, u: &mut Input<'_>| {
        if !u.u8().is_multiple_of(8) {
            w.set(&key, Value::U32(u.lie(v).min(u32::MAX as u64) as u32));
        }
    };
    set(&mut w, k("embedding_length"), n_embd, &mut u);
    set(&mut w, k("block_count"), n_layer, &mut u);
    set(&mut w, k("attention.head_count"), n_head, &mut u);
    set(&mut w, k("attention.head_count_kv"), n_head_kv, &mut u);
    set(&mut w, k("attention.key_length"), head_dim, &mut u);
    set(&mut w, k("feed_forward_length"), n_ff, &mut u);
    set(&mut w, k("context_length"), 64, &mut u);
    set(&mut w, k("rope.dimension_count"), head_dim, &mut u);
    set(&mut w, k("vocab_size"), n_vocab, &mut u);
    if let Some(x) = experts {
        set(&mut w, k("expert_count"), x.count, &mut u);
        set(&mut w, k("expert_used_count"), x.used, &mut u);
    }
    if let Some(x) = ssm {
        set(&mut w, k("ssm.conv_kernel"), x.conv_kernel, &mut u);
        set(&mut w, k("ssm.inner_size"), x.inner_size, &mut u);
        set(&mut w, k("ssm.state_size"), x.state_size, &mut u);
        set(&mut w, k("ssm.time_step_rank"), x.time_step_rank, &mut u);
    }
    if config.attn.sliding_window.is_some() {
        set(&mut w, k("attention.sliding_window"), 4, &mut u);
    }
    let eps = match u.u8() % 8 {
        0 => f32::NAN,
        1 => -1.0,
        2 => f32::INFINITY,
        _ => 1e-5,
    };
    w.set(&k("attention.layer_norm_rms_epsilon"), Value::F32(eps));
    w.set(&k("attention.layer_norm_epsilon"), Value::F32(eps));
    let base = if u.u8().is_multiple_of(8) { 0.0 } else { 1e4 };
    w.set(&k("rope.freq_base"), Value::F32(base));
    if u.bit() {
        // A vocabulary: SentencePiece pieces with scores and types, special ids that may lie.
        let pieces: Vec<GgufString> = (0..n_vocab)
            .map(|i| GgufString::from(format!("<{i}>").as_str()))
            .collect();
        w.set_str("tokenizer.ggml.model", "llama");
        w.set("tokenizer.ggml.tokens", Value::Array(Array::String(pieces)));
        let scores = (0..n_vocab).map(|i| -(i as f32)).collect();
        w.set("tokenizer.ggml.scores", Value::Array(Array::F32(scores)));
        let types = (0..n_vocab).map(|_| 1).collect();
        w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
        let bos = u.lie(1) as u32;
        w.set("tokenizer.ggml.bos_token_id", Value::U32(bos));
    }

    // The tensors: dims perhaps changed, a type, bytes from the input.
    let mut tensors = Vec::new();
    for d in &decls {
        if u.u8().is_multiple_of(32) {
            continue; // dropped
        }
        let mut dims: Vec<u64> = d.dims.iter().map(|&x| x as u64).collect();
        match u.u8() % 16 {
            0 if dims.len() >= 2 => dims.swap(0, 1),
            1 => dims[0] *= 2,
            2 => dims.push(2),
            3 if dims.len() >= 2 => {
                let n: u64 = dims.iter().product();
                dims = vec![n];
            }
            _ => {}
        }
        let pick = u.u8();
        let ty = match pick % 4 {
            // Vectors (norms, biases) stay F32 but one time in sixteen.
            _ if dims.len() == 1 && pick % 16 >= 4 => GgmlType::F32,
            1 => GgmlType::F16,
            2 if dims[0].is_multiple_of(32) => GgmlType::Q8_0,
            3 if dims[0].is_multiple_of(32) => GgmlType::Q4_0,
            _ => GgmlType::F32,
        };
        let n: u64 = dims.iter().product();
        let bytes = ty.bytes_for(dims[0], n)? as usize;
        if bytes > 1 << 20 {
            return None;
        }
        let fill = u.u8();
        let data: Vec<u8> = (0..bytes)
            .map(|i| match fill % 4 {
                // Small floats (and, for quantized blocks, small scales).
                0 => [0x00, 0x00, 0x80, 0x3c][i % 4],
                1 => (i as u8).wrapping_mul(fill),
                2 => 0xff, // NaNs
                _ => 0,
            })
            .collect();
        tensors.push((d.name.clone(), ty, dims, data));
    }
    if u.u8().is_multiple_of(16) {
        tensors.push((
            "blk.9.attn_q.weight".into(),
            GgmlType::F32,
            vec![4, 4],
            vec![0; 64],
        ));
    }
    for (name, ty, dims, data) in &tensors {
        w.add_tensor(name, *ty, dims, data).ok()?;
    }
    let mut out = Vec::new();
    w.write_to(&mut out).ok()?;
    Some(out)
}

/// Opens the model the input describes and decodes three tokens: values or errors, never a
/// panic. True when the tokens were decoded.
pub fn run(data: &[u8]) -> bool {
    let Some(bytes) = model_file(data) else {
        return false;
    };
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    let path = dir.path().join("model.gguf");
    if std::fs::write(&path, &bytes).is_err() {
        return false;
    }
    let Ok(model) = Model::open(&path) else {
        return false;
    };
    let model: Arc<Model> = model;
    let _ = model.tokenizer();
    let opts = SessionOptions {
        n_ctx: 8,
        ..SessionOptions::default()
    };
    match Session::with_options(model, opts) {
        Ok(mut s) => s.eval_batch(&[0, 1]).is_ok() && s.eval(0).is_ok(),
        Err(_) => false,
    }
}
