//! What the fuzz targets past the parsers do with one input, written once: each target calls
//! its function here, and `tinynn-train/tests/fuzz_corpora.rs` replays the corpora through the
//! same functions (both compile this file with `#[path]`). Each returns true when the input was
//! accepted and fully exercised, so the replay can check which seeds work.
#![allow(dead_code)] // every includer uses only some of them

use std::sync::Arc;

use tinynn_format::gguf::Gguf;
use tinynn_models::lora::{AppliedLora, LoraAdapter};
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};
use tinynn_models::tokenizer::Tokenizer;
use tinynn_train::data::{BinTokens, Sequences};

/// `data` in a temporary file named `name` (kept alive by the returned directory).
fn in_file(data: &[u8], name: &str) -> Option<(tempfile::TempDir, std::path::PathBuf)> {
    let dir = tempfile::tempdir().ok()?;
    let path = dir.path().join(name);
    std::fs::write(&path, data).ok()?;
    Some((dir, path))
}

/// Encodes, decodes and streams a fixed text: true when it encoded.
fn exercise(tok: &Tokenizer) -> bool {
    let Ok(ids) = tok.encode("Hello wörld 12345 🦀 <s>", true) else {
        return false;
    };
    let _ = tok.decode(&ids);
    let mut s = tok.text_stream(&ids[..ids.len().min(2)]);
    for &id in &ids {
        let _ = s.step(tok, id);
    }
    let _ = s.finish(tok);
    true
}

/// Any bytes as a GGUF file: its vocabulary's byte table and tokenizer, exercised.
pub fn tokenizer_gguf(data: &[u8]) -> bool {
    let Ok(g) = Gguf::parse(data) else {
        return false;
    };
    let _ = tinynn_models::vocab::Vocab::from_gguf(&g);
    Tokenizer::from_gguf(&g).is_ok_and(|tok| exercise(&tok))
}

/// Any file as a Hugging Face `tokenizer.json`: a tokenizer with dense ids, exercised.
pub fn tokenizer_json(data: &[u8]) -> bool {
    let Some((_dir, file)) = in_file(data, "tokenizer.json") else {
        return false;
    };
    let Ok(tok) = Tokenizer::from_hf_file(&file, None, None) else {
        return false;
    };
    let _ = tok.vocab_kind();
    exercise(&tok)
}

/// Any file as a LoRA adapter for `base`: refused, or applied at scale 0.5 in a session that
/// evaluates three tokens (true when they evaluated).
pub fn lora_adapter(base: &Arc<Model>, data: &[u8]) -> bool {
    let Some((_dir, file)) = in_file(data, "adapter.gguf") else {
        return false;
    };
    let Ok(adapter) = LoraAdapter::open(&file) else {
        return false;
    };
    if adapter.check_base(&base.source()).is_err() {
        return false;
    }
    let opts = SessionOptions {
        n_ctx: 8,
        lora: vec![AppliedLora::new(adapter, 0.5)],
        ..SessionOptions::default()
    };
    Session::with_options(base.clone(), opts).is_ok_and(|mut s| s.eval_batch(&[1, 2, 3]).is_ok())
}

/// A sequence length and vocabulary (first 3 bytes) and a `.bin` file of i32 ids (the rest):
/// refused, or every sequence read (up to 64).
pub fn bin_data(data: &[u8]) -> bool {
    let [s, v0, v1, rest @ ..] = data else {
        return false;
    };
    let seq = usize::from(*s % 64);
    let vocab = usize::from(u16::from_le_bytes([*v0, *v1]));
    let Some((_dir, file)) = in_file(rest, "data.bin") else {
        return false;
    };
    let Ok(bin) = BinTokens::open(&[file], seq, vocab) else {
        return false;
    };
    if bin.check_all().is_err() {
        return false;
    }
    let mut inputs = vec![0i32; bin.seq_len()];
    let mut labels = vec![0i32; bin.seq_len()];
    (0..bin.len().min(64)).all(|i| bin.read(i, &mut inputs, &mut labels).is_ok())
}
