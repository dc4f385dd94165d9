//! Streamed text is the tokenizer's own decoding: for byte-level BPE (SmolLM2), SentencePiece
//! with byte pieces (Gemma 3), and `tokenizer.json` vocabularies of other kinds (WordPiece,
//! Unigram), the pieces a `TextStream` hands out, joined, are what decoding the prompt and the
//! generated tokens together adds to the prompt's text — on many random sequences, with and
//! without a prompt, UTF-8 characters split over tokens included.

use std::path::Path;

use tinynn_core::rng::Rng;
use tinynn_format::gguf::GgufFile;
use tinynn_format::model_cache::{require_model, KnownModel};
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::{Vocab, VocabKind};

/// Streams `ids` after `context` and checks the text against whole decodes.
fn check(tok: &Tokenizer, context: &[u32], ids: &[u32], what: &str) {
    let mut stream = tok.text_stream(context);
    let mut got = String::new();
    for &id in ids {
        got.push_str(&stream.step(tok, id).unwrap());
    }
    got.push_str(&stream.finish(tok).unwrap());
    let all: Vec<u32> = context.iter().chain(ids).copied().collect();
    let whole = tok.decode(&all).unwrap();
    let before = tok.decode(context).unwrap();
    let want = if context.is_empty() {
        whole.clone()
    } else {
        // The seed is the prompt's last four tokens: what the generated tokens add to them.
        let tail = &context[context.len().saturating_sub(4)..];
        let t = tok.decode(tail).unwrap();
        let with = tok
            .decode(&tail.iter().chain(ids).copied().collect::<Vec<_>>())
            .unwrap();
        assert!(
            whole.starts_with(&before) || with.starts_with(&t),
            "{what}: not prefix-stable"
        );
        with.strip_prefix(t.as_str()).unwrap_or(&with).to_string()
    };
    assert_eq!(got, want, "{what}: context {context:?}, ids {ids:?}");
}

fn random_runs(tok: &Tokenizer, name: &str, n_vocab: u32, text: &str) {
    let mut rng = Rng::new(17);
    let prompt = tok.encode(text, true).unwrap();
    for run in 0..150 {
        let len = 1 + rng.below(40) as usize;
        let ids: Vec<u32> = (0..len)
            .map(|_| rng.below(u64::from(n_vocab)) as u32)
            .collect();
        let ctx: &[u32] = if run % 2 == 0 { &[] } else { &prompt };
        check(tok, ctx, &ids, &format!("{name} run {run}"));
    }
    // Real text, token by token: the stream gives it back exactly.
    let ids = tok.encode(text, false).unwrap();
    let mut stream = tok.text_stream(&[]);
    let mut got = String::new();
    for &id in &ids {
        got.push_str(&stream.step(tok, id).unwrap());
    }
    got.push_str(&stream.finish(tok).unwrap());
    assert_eq!(got, tok.decode(&ids).unwrap(), "{name}");
}

const TEXT: &str = "Héllo, wörld! 你好世界 🦀🚀 naïve café — «quotes» ∑ 12345\n\tindented";

#[test]
fn gguf_vocabularies_stream_as_they_decode() {
    for m in [KnownModel::SmolLm2, KnownModel::Gemma3] {
        let f = GgufFile::open(require_model(m).unwrap()).unwrap();
        let tok = Tokenizer::from_gguf(f.gguf()).unwrap();
        random_runs(&tok, m.name(), tok.vocab_size() as u32, TEXT);
        // A multi-byte character as byte pieces waits until it is whole.
        let ids = tok.encode("🦀", false).unwrap();
        let mut s = tok.text_stream(&[]);
        let pieces: Vec<String> = ids.iter().map(|&i| s.step(&tok, i).unwrap()).collect();
        assert_eq!(pieces.concat(), "🦀", "{}", m.name());
        assert!(pieces.iter().all(|p| !p.contains('\u{fffd}')), "{pieces:?}");
    }
}

#[test]
fn a_continuation_keeps_its_leading_space() {
    // SentencePiece decoders strip the first space of a text; a reply continues its prompt.
    let f = GgufFile::open(require_model(KnownModel::Gemma3).unwrap()).unwrap();
    let tok = Tokenizer::from_gguf(f.gguf()).unwrap();
    let prompt = tok.encode("The capital of France is", true).unwrap();
    let more = tok.encode(" Paris, of course.", false).unwrap();
    let mut s = tok.text_stream(&prompt);
    let mut got = String::new();
    for &id in &more {
        got.push_str(&s.step(&tok, id).unwrap());
    }
    got.push_str(&s.finish(&tok).unwrap());
    assert_eq!(got, " Paris, of course.");
}

fn json_tokenizer(dir: &Path, json: &str) -> Tokenizer {
    let p = dir.join("tokenizer.json");
    std::fs::write(&p, json).unwrap();
    Tokenizer::from_hf_file(&p, None, None).unwrap()
}

#[test]
fn wordpiece_and_unigram_vocabularies_decode_with_their_decoders() {
    let dir = tempfile::tempdir().unwrap();
    let wordpiece = json_tokenizer(
        dir.path(),
        r###"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,"pre_tokenizer":{"type":"Whitespace"},"post_processor":null,
        "decoder":{"type":"WordPiece","prefix":"##","cleanup":true},
        "model":{"type":"WordPiece","unk_token":"[UNK]","continuing_subword_prefix":"##",
          "max_input_chars_per_word":100,
          "vocab":{"[UNK]":0,"hello":1,"world":2,"##s":3,"play":4,"##ing":5,",":6,"!":7,"the":8}}}"###,
    );
    let ids = wordpiece
        .encode("hello worlds, playing the world!", false)
        .unwrap();
    assert_eq!(ids, [1, 2, 3, 6, 4, 5, 8, 2, 7]);
    let mut s = wordpiece.text_stream(&[]);
    let pieces: Vec<String> = ids
        .iter()
        .map(|&i| s.step(&wordpiece, i).unwrap())
        .collect();
    // "##s" joins its word; punctuation has no space before it.
    assert_eq!(pieces.concat(), "hello worlds, playing the world!");
    assert_eq!(pieces[2], "s");
    random_runs(&wordpiece, "wordpiece", 9, "hello world");

    let unigram = json_tokenizer(
        dir.path(),
        r###"{"version":"1.0","truncation":null,"padding":null,"added_tokens":[],
        "normalizer":null,
        "pre_tokenizer":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
        "post_processor":null,
        "decoder":{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true},
        "model":{"type":"Unigram","unk_id":0,"byte_fallback":false,
          "vocab":[["<unk>",0.0],["▁hello",-1.0],["▁world",-1.5],["s",-2.0],["▁",-3.0],
                   ["a",-3.0],["b",-3.0],["▁ab",-2.5]]}}"###,
    );
    assert_eq!(unigram.vocab_kind(), VocabKind::SentencePiece);
    let v = Vocab::from_strings(unigram.token_strings(), unigram.vocab_kind());
    assert_eq!(v.token_bytes(1), b" hello");
    let ids = unigram.encode("hello worlds ab", false).unwrap();
    let mut s = unigram.text_stream(&[]);
    let text: String = ids
        .iter()
        .map(|&i| s.step(&unigram, i).unwrap())
        .collect::<String>()
        + &s.finish(&unigram).unwrap();
    assert_eq!(text, "hello worlds ab");
    random_runs(&unigram, "unigram", 8, "hello world");
}
