//! The SmolLM2 tokenizer built from GGUF metadata: the reference ids (llama.cpp's),
//! special tokens, and exact round trips.

use tinynn_format::gguf::GgufFile;
use tinynn_format::model_cache::ensure_default_model;
use tinynn_models::tokenizer::{StreamDecoder, Tokenizer};
use tinynn_models::vocab::Vocab;

fn tokenizer() -> (GgufFile, Tokenizer) {
    let file = GgufFile::open(ensure_default_model().unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(file.gguf()).unwrap();
    (file, tok)
}

#[test]
fn reference_ids() {
    let (_, tok) = tokenizer();
    let cases: [(&str, &[u32]); 2] = [
        (
            "Hello world! The quick brown fox jumps over the lazy dog.",
            &[
                19556, 905, 17, 378, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30,
            ],
        ),
        ("The capital of France is", &[504, 3575, 282, 4649, 314]),
    ];
    for (text, ids) in cases {
        assert_eq!(tok.encode(text, true).unwrap(), ids, "{text:?}");
    }
    // Digits are split one by one (the smollm pre-tokenizer).
    let digits = tok.encode("311", false).unwrap();
    assert_eq!(digits.len(), 3);
    // Control tokens are matched whole.
    let chat = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!((chat[0], *chat.last().unwrap()), (1, 2));
    assert!(tok.is_end(2) || tok.is_end(0));
}

#[test]
fn round_trips_exactly() {
    let (file, tok) = tokenizer();
    let vocab = Vocab::from_gguf(file.gguf()).unwrap();
    let texts = [
        std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap_or_default(),
        "naïve café — 東京 🦀 \t\n  spaces   and\r\nCRLF 12345".to_string(),
    ];
    assert!(
        texts[0].len() > 30_000,
        "the GPL-3 text is part of the test data (Debian's base-files)"
    );
    for text in &texts {
        let ids = tok.encode(text, false).unwrap();
        assert_eq!(&tok.decode(&ids).unwrap(), text);
        // Our own byte-level detokenizer agrees, and streaming never splits a character.
        assert_eq!(String::from_utf8(vocab.decode(&ids)).unwrap(), *text);
        let mut stream = StreamDecoder::default();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.push(&vocab.token_bytes(id)));
        }
        out.push_str(&stream.finish());
        assert_eq!(&out, text);
    }
}

#[test]
fn stream_decoder_holds_partial_characters() {
    let mut s = StreamDecoder::default();
    let crab = "🦀".as_bytes();
    assert_eq!(s.push(&crab[..2]), "");
    assert_eq!(s.push(&crab[2..]), "🦀");
    assert_eq!(s.push(b"a\xE6"), "a");
    assert_eq!(s.finish(), "\u{FFFD}");
}
