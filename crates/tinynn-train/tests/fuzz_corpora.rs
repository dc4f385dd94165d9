//! Replays the corpora of the fuzz targets past the parsers (fuzz/corpus/{chat_template,
//! chat_jsonl, tokenizer_gguf, checkpoint}: the seeds and whatever `cargo fuzz` kept) through
//! the same code the targets run: nothing panics, and the seeds that are valid work. The test
//! command also runs this in the `overflow` profile (release with overflow checks).

use std::path::Path;

use tinynn_format::gguf::Gguf;
use tinynn_format::malformed_corpus::fuzz_corpus;
use tinynn_models::chat::{ChatTemplate, Message};
use tinynn_models::tokenizer::Tokenizer;
use tinynn_train::data::parse_messages;

fn no_panic<T>(path: &Path, f: impl FnOnce() -> T) -> T {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
        .unwrap_or_else(|_| panic!("{} panicked", path.display()))
}

#[test]
fn chat_templates() {
    let mut rendered = 0;
    for (path, data) in fuzz_corpus("chat_template") {
        no_panic(&path, || {
            let (tpl, rest) = match data.iter().position(|&b| b == 0) {
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (&data[..], &[][..]),
            };
            let Ok(source) = std::str::from_utf8(tpl) else {
                return;
            };
            let messages = std::str::from_utf8(rest)
                .ok()
                .and_then(|l| parse_messages(l).ok())
                .unwrap_or_else(|| vec![Message::new("user", "Hello")]);
            let t = ChatTemplate::new(source.to_string(), "<s>", "</s>");
            if t.render(&messages, true).is_ok() {
                rendered += 1;
            }
        });
    }
    assert!(rendered >= 3, "the built-in templates render: {rendered}");
}

#[test]
fn chat_jsonl_lines() {
    let chatml =
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
    let mut parsed = 0;
    for (path, data) in fuzz_corpus("chat_jsonl") {
        no_panic(&path, || {
            if let Some(m) = std::str::from_utf8(&data)
                .ok()
                .and_then(|l| parse_messages(l).ok())
            {
                parsed += 1;
                let _ = ChatTemplate::new(chatml.into(), "", "").render(&m, false);
            }
        });
    }
    assert!(parsed >= 1);
}

#[test]
fn gguf_vocabularies() {
    let mut built = 0;
    for (path, data) in fuzz_corpus("tokenizer_gguf") {
        no_panic(&path, || {
            let Ok(g) = Gguf::parse(&data) else { return };
            let _ = tinynn_models::vocab::Vocab::from_gguf(&g);
            let Ok(tok) = Tokenizer::from_gguf(&g) else {
                return;
            };
            built += 1;
            if let Ok(ids) = tok.encode("Hello wörld 12345 🦀 <s>", true) {
                let _ = tok.decode(&ids);
                let mut s = tok.text_stream(&ids[..ids.len().min(2)]);
                for &id in &ids {
                    let _ = s.step(&tok, id);
                }
                let _ = s.finish(&tok);
            }
        });
    }
    assert!(built >= 2, "the seed vocabularies build: {built}");
}

#[test]
fn checkpoints() {
    let mut loaded = 0;
    for (path, _) in fuzz_corpus("checkpoint") {
        no_panic(&path, || {
            if tinynn_train::checkpoint::load(&path).is_ok() {
                loaded += 1;
            }
        });
    }
    assert!(loaded >= 1, "the seed checkpoint loads");
}
