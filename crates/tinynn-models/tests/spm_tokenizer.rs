//! SentencePiece (`tokenizer.ggml.model = llama`) vocabularies: a 400-piece BPE model with byte
//! fallback trained by `sentencepiece` (scripts/make-spm-fixture.py) and stored in GGUF; our ids
//! equal sentencepiece's, and decoding gives the text back. Written as a `tokenizer.json` the
//! way transformers writes them and converted back (`tnn convert`), a vocabulary tokenizes as
//! before.

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

/// A small SentencePiece vocabulary whose pieces split into very many merges ("a" repeated 1
/// to 1500 times: ~1.1 M merges, ~1.1 GB of merge strings) or with an absurdly long piece is
/// refused, naming the limit, instead of building merges in memory quadratic in piece length.
#[test]
fn vocabularies_with_quadratic_merges_are_refused() {
    use tinynn_format::gguf::{Array, Gguf, GgufString, GgufWriter, Key, Value};
    let spm = |pieces: Vec<String>| {
        let mut w = GgufWriter::new();
        w.set_key(
            Key::TokenizerModel,
            Value::String(GgufString::from("llama")),
        )
        .unwrap();
        let n = pieces.len();
        let tokens = pieces
            .iter()
            .map(|p| GgufString::from(p.as_str()))
            .collect();
        w.set_key(Key::TokenizerTokens, Value::Array(Array::String(tokens)))
            .unwrap();
        let scores = (0..n).map(|i| -(i as f32)).collect();
        w.set_key(Key::TokenizerScores, Value::Array(Array::F32(scores)))
            .unwrap();
        w.set_key(
            Key::TokenizerTokenType,
            Value::Array(Array::I32(vec![1; n])),
        )
        .unwrap();
        let mut out = Vec::new();
        w.write_to(&mut out).unwrap();
        match Tokenizer::from_gguf(&Gguf::parse(&out).unwrap()) {
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    };
    let small: Vec<String> = (1..=40).map(|n| "a".repeat(n)).collect();
    assert_eq!(spm(small), Ok(()));
    let runs: Vec<String> = (1..=1500).map(|n| "a".repeat(n)).collect();
    let err = spm(runs).unwrap_err();
    assert!(err.contains("more than the limits of"), "{err}");
    let long = vec!["a".into(), "b".repeat(5000)];
    let err = spm(long).unwrap_err();
    assert!(err.contains("piece 1 is 5000 bytes"), "{err}");
}

/// `tokenizer` written as `tokenizer.json` (`Tokenizer::to_hf_json`), restyled by `restyle`
/// as other transformers versions write it, and converted back to GGUF keys: the tokenizer
/// made from them gives `tokenizer`'s ids on `texts`.
fn round_trip(
    tokenizer: &Tokenizer,
    restyle: &dyn Fn(&mut serde_json::Value),
    texts: &[&str],
    what: &str,
) {
    use tinynn_format::gguf::{Gguf, GgufWriter, Value};
    let mut json: serde_json::Value =
        serde_json::from_str(&tokenizer.to_hf_json().unwrap()).unwrap();
    assert_eq!(json["model"]["byte_fallback"], true, "{what}");
    restyle(&mut json);
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    tinynn_models::convert::vocab_json::write_vocab(
        &mut w,
        &json,
        tokenizer.bos(),
        tokenizer.eos(),
    )
    .unwrap();
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let back = Tokenizer::from_gguf(&Gguf::parse(&bytes).unwrap()).unwrap();
    for text in texts {
        for special in [false, true] {
            assert_eq!(
                back.encode(text, special).unwrap(),
                tokenizer.encode(text, special).unwrap(),
                "{what}: {:?}",
                &text[..text.len().min(40)]
            );
        }
    }
}

#[test]
fn sentencepiece_tokenizer_json_converts_back_to_the_same_ids() {
    let gpl = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let texts = [
        "Hello world! The quick brown fox jumps over the lazy dog.",
        " leading space,  two  spaces\n\nnew lines\ttab",
        "12345 émigré façade 日本語のテキスト 🙂🙂",
        "",
        gpl.as_str(),
    ];
    // Llama 2 style (a ▁ in front of the text): as a Prepend + Replace normalizer, and as the
    // Metaspace pre-tokenizer newer transformers versions write instead.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let file = GgufFile::open(dir.join("spm-vocab.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(file.gguf()).unwrap();
    round_trip(&tok, &|_| {}, &texts, "normalizer");
    let metaspace = |j: &mut serde_json::Value| {
        j["normalizer"] = serde_json::Value::Null;
        j["pre_tokenizer"] = serde_json::json!({"type": "Metaspace", "replacement": "\u{2581}",
            "prepend_scheme": "first", "split": false});
    };
    round_trip(&tok, &metaspace, &texts, "Metaspace");

    // Gemma 3 (262k pieces, no ▁ in front, control and user-defined tokens).
    use tinynn_format::model_cache::{require_model, KnownModel};
    let path = require_model(KnownModel::Gemma3).unwrap();
    let gemma = GgufFile::open(path).unwrap();
    let tok = Tokenizer::from_gguf(gemma.gguf()).unwrap();
    let mut texts = texts.to_vec();
    texts.push("<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");
    round_trip(&tok, &|_| {}, &texts, "Gemma 3");
}
