//! Small, well-formed GGUF files that describe a model wrongly, made from the architectures'
//! converted fixtures: shared by `tinynn-models/tests/hostile_models.rs` (through the library)
//! and `tinynn-cli/tests/hostile_cli.rs` (through `tnn`).

use std::path::{Path, PathBuf};

use tinynn_format::gguf::{GgufFile, GgufWriter, Value};
use tinynn_format::GgmlType;
use tinynn_models::convert::{convert_hf, ConvertOptions};
use tinynn_models::model::Model;

pub const BASES: [&str; 7] = [
    "tiny-llama",
    "tiny-qwen3",
    "tiny-gemma3",
    "tiny-gpt2",
    "tiny-gptneox",
    "tiny-phi3",
    "tiny-mixtral",
];

/// New dims for a tensor's dims.
pub type Reshape = fn(&[u64]) -> Vec<u64>;

/// One way to describe the model wrongly.
pub struct Mutant {
    pub what: &'static str,
    /// Arch-scoped keys (`{arch}.` prepended) or whole keys (starting with `tokenizer.` or
    /// `general.`) set to a value; `None` removes the key.
    keys: Vec<(&'static str, Option<Value>)>,
    /// Tensors left out.
    drop: Vec<&'static str>,
    /// A tensor given other dims (the same number of elements).
    reshape: Option<(&'static str, Reshape)>,
    /// A tensor added (copy of the token embedding's bytes under another name).
    extra: Option<&'static str>,
}

pub fn mutant(what: &'static str) -> Mutant {
    Mutant {
        what,
        keys: Vec::new(),
        drop: Vec::new(),
        reshape: None,
        extra: None,
    }
}

pub fn mutants() -> Vec<Mutant> {
    let key = |what, k: &'static str, v: Option<Value>| Mutant {
        keys: vec![(k, v)],
        ..mutant(what)
    };
    let u = |v: u32| Some(Value::U32(v));
    vec![
        key("3 heads", "attention.head_count", u(3)),
        key("no KV heads", "attention.head_count_kv", u(0)),
        key(
            "KV heads not dividing the heads",
            "attention.head_count_kv",
            u(3),
        ),
        key("more KV heads than heads", "attention.head_count_kv", u(64)),
        key("RoPE wider than a head", "rope.dimension_count", u(1000)),
        key("RoPE of 0 dims", "rope.dimension_count", u(0)),
        key(
            "vocabulary larger than the embedding",
            "vocab_size",
            u(100_000),
        ),
        key("one block more than present", "block_count", u(3)),
        key("no blocks", "block_count", u(0)),
        key(
            "embedding width not the tensors'",
            "embedding_length",
            u(48),
        ),
        key(
            "feed-forward width not the tensors'",
            "feed_forward_length",
            u(7),
        ),
        key("context of 0", "context_length", u(0)),
        key("context of 2^31", "context_length", u(1 << 31)),
        key("sliding window of 0", "attention.sliding_window", u(0)),
        key(
            "NaN epsilon",
            "attention.layer_norm_rms_epsilon",
            Some(Value::F32(f32::NAN)),
        ),
        key(
            "NaN LayerNorm epsilon",
            "attention.layer_norm_epsilon",
            Some(Value::F32(f32::NAN)),
        ),
        key("RoPE base of 0", "rope.freq_base", Some(Value::F32(0.0))),
        key(
            "infinite RoPE scale",
            "rope.scaling.factor",
            Some(Value::F32(f32::INFINITY)),
        ),
        key("head count removed", "attention.head_count", None),
        key(
            "BOS past the vocabulary",
            "tokenizer.ggml.bos_token_id",
            u(1 << 30),
        ),
        key(
            "EOS past the vocabulary",
            "tokenizer.ggml.eos_token_id",
            u(u32::MAX),
        ),
        key("no architecture", "general.architecture", None),
        key(
            "more experts used than there are",
            "expert_used_count",
            u(9),
        ),
        key("no experts used", "expert_used_count", u(0)),
        key("eight experts where four are stored", "expert_count", u(8)),
        key("2^20 experts", "expert_count", u(1 << 20)),
        key("experts without a count used", "expert_count", u(4)),
        Mutant {
            drop: vec!["blk.0.ffn_gate_inp.weight"],
            ..mutant("a router missing")
        },
        Mutant {
            reshape: Some(("blk.1.ffn_down_exps.weight", |d| {
                vec![d[0], d[1] * 2, d[2] / 2]
            })),
            ..mutant("experts of the wrong shape")
        },
        Mutant {
            drop: vec!["blk.1.attn_output.weight"],
            ..mutant("a block tensor missing")
        },
        Mutant {
            drop: vec!["token_embd.weight"],
            ..mutant("no token embedding")
        },
        Mutant {
            drop: vec!["output_norm.weight"],
            ..mutant("no final norm")
        },
        Mutant {
            reshape: Some(("blk.0.attn_output.weight", |d| vec![d[0] / 2, d[1] * 2])),
            ..mutant("attention output of the wrong shape")
        },
        Mutant {
            reshape: Some(("token_embd.weight", |d| vec![d[0] * d[1]])),
            ..mutant("a 1-D token embedding")
        },
        Mutant {
            reshape: Some(("output_norm.weight", |d| vec![1, d[0]])),
            ..mutant("a 2-D norm")
        },
        Mutant {
            extra: Some("blk.7.attn_q.weight"),
            ..mutant("a tensor of a block that does not exist")
        },
    ]
}

/// The mutant of `base` (a GGUF file of architecture `arch`) written to `out`.
pub fn write_mutant(base: &GgufFile, arch: &str, m: &Mutant, out: &Path) {
    let g = base.gguf();
    let mut w = GgufWriter::new();
    let full = |k: &str| {
        if k.starts_with("tokenizer.") || k.starts_with("general.") {
            k.to_string()
        } else {
            format!("{arch}.{k}")
        }
    };
    let removed: Vec<String> = m
        .keys
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| full(k))
        .collect();
    for kv in g.metadata() {
        if !removed.contains(&kv.key) {
            w.set(&kv.key, kv.value.clone());
        }
    }
    for (k, v) in &m.keys {
        if let Some(v) = v {
            w.set(&full(k), v.clone());
        }
    }
    let mut embd = None;
    for t in g.tensors() {
        if m.drop.contains(&t.name.as_str()) {
            continue;
        }
        let data = g.tensor_data(base.bytes(), t).unwrap();
        if t.name == "token_embd.weight" {
            embd = Some((t.ggml_type, t.dims.clone(), data));
        }
        let dims = match m.reshape {
            Some((name, f)) if name == t.name => f(&t.dims),
            _ => t.dims.clone(),
        };
        w.add_tensor(&t.name, t.ggml_type, &dims, data).unwrap();
    }
    if let (Some(name), Some((ty, dims, data))) = (m.extra, embd) {
        w.add_tensor(name, ty, &dims, data).unwrap();
    }
    w.write_atomic(out).unwrap();
}

/// Rewrites the GGUF file `path` with the `tokenizer.*` keys of the one at `from`.
fn add_vocabulary(path: &Path, from: &Path) {
    let (b, v) = (GgufFile::open(path).unwrap(), GgufFile::open(from).unwrap());
    let mut w = GgufWriter::new();
    for kv in b.gguf().metadata().iter().chain(
        v.gguf()
            .metadata()
            .iter()
            .filter(|kv| kv.key.starts_with("tokenizer.")),
    ) {
        w.set(&kv.key, kv.value.clone());
    }
    for t in b.gguf().tensors() {
        let data = b.gguf().tensor_data(b.bytes(), t).unwrap();
        w.add_tensor(&t.name, t.ggml_type, &t.dims, data).unwrap();
    }
    w.write_atomic(path).unwrap();
}

/// One file of the corpus: which base, which mutant, where.
pub struct Case {
    pub base: &'static str,
    pub what: &'static str,
    pub path: PathBuf,
}

/// Each base converted to GGUF (F32) in `dir` — `(base name, path)` — and every mutant of it.
pub fn write_corpus(dir: &Path) -> (Vec<(&'static str, PathBuf)>, Vec<Case>) {
    let fixtures =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tinynn-models/tests/fixtures");
    let mut bases: Vec<(&'static str, PathBuf)> = Vec::new();
    let mut cases = Vec::new();
    for base_name in BASES {
        let fx = fixtures.join(base_name);
        let base_path = dir.join(format!("{base_name}.gguf"));
        let opts = ConvertOptions {
            out_type: GgmlType::F32,
            tokenizer: fx.join("tokenizer.json").is_file(),
        };
        let hf = Model::open(&fx).unwrap();
        let arch = hf.config().architecture.name().to_string();
        convert_hf(&hf, &base_path, &opts).unwrap();
        if !opts.tokenizer {
            // A vocabulary for text to go through: the first base's (every fixture has 320
            // tokens).
            let (_, with_vocab) = bases.first().expect("the first base has a tokenizer.json");
            add_vocabulary(&base_path, with_vocab.as_path());
        }
        let base = GgufFile::open(&base_path).unwrap();
        for (i, m) in mutants().iter().enumerate() {
            let path = dir.join(format!("{base_name}-{i}.gguf"));
            write_mutant(&base, &arch, m, &path);
            cases.push(Case {
                base: base_name,
                what: m.what,
                path,
            });
        }
        bases.push((base_name, base_path));
    }
    (bases, cases)
}
