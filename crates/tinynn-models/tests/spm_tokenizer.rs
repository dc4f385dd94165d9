//! SentencePiece (`tokenizer.ggml.model = llama`) vocabularies: a 400-piece BPE model with byte
//! fallback trained by `sentencepiece` (scripts/make-spm-fixture.py) and stored in GGUF; our ids
//! equal sentencepiece's, and decoding gives the text back.

use std::path::Path;

use tinynn_format::gguf::GgufFile;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::{Vocab, VocabKind};

#[test]
fn ids_match_sentencepiece() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let file = GgufFile::open(dir.join("spm-vocab.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(file.gguf()).unwrap();
    let vocab = Vocab::from_gguf(file.gguf()).unwrap();
    assert_eq!(vocab.kind(), VocabKind::SentencePiece);
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("spm-ids.json")).unwrap()).unwrap();
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(tok.encode(text, false).unwrap(), want, "{text:?}");
        // BOS in front when asked for special tokens (add_bos_token is true).
        assert_eq!(tok.encode(text, true).unwrap()[0], 1);
        assert_eq!(tok.decode(&want).unwrap(), text, "{text:?}");
        // Streaming bytes: the prefix space SentencePiece adds, then the text.
        assert_eq!(
            String::from_utf8(vocab.decode(&want)).unwrap(),
            format!(" {text}")
        );
    }
}

/// Special-token ids must name tokens of the file's vocabulary: one past the end, or one a
/// `u32` cannot hold (which used to be truncated), is an error naming the key.
#[test]
fn special_ids_outside_the_vocabulary_are_refused() {
    use tinynn_format::gguf::{Gguf, GgufWriter, Key, Value};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let bytes = std::fs::read(dir.join("spm-vocab.gguf")).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert!(Tokenizer::from_gguf(&g).is_ok());
    let n_tokens = match g.get_array(Key::TokenizerTokens).unwrap() {
        Some(a) => a.len() as u64,
        None => panic!("the fixture has tokens"),
    };
    for (key, value) in [
        (Key::TokenizerBosId, Value::U64(n_tokens)),
        (Key::TokenizerEosId, Value::U64((1 << 32) + 1)),
        (Key::TokenizerEotId, Value::U32(u32::MAX)),
    ] {
        let mut w = GgufWriter::from_gguf(&g, &bytes).unwrap();
        w.set_key(key, value).unwrap();
        let mut out = Vec::new();
        w.write_to(&mut out).unwrap();
        let err = match Tokenizer::from_gguf(&Gguf::parse(&out).unwrap()) {
            Ok(_) => panic!("{key:?}: an id outside the vocabulary was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("which is not a token id") && err.contains(&format!("{n_tokens} tokens")),
            "{err}"
        );
    }
}
