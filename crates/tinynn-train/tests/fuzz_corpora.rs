//! Replays the corpora of the fuzz targets past the parsers (fuzz/corpus/{chat_template,
//! chat_jsonl, tokenizer_gguf, tokenizer_json, checkpoint, lora_adapter, bin_data}: the seeds
//! and whatever `cargo fuzz` kept) through
//! the same code the targets run (`fuzz/fuzz_targets/bodies.rs`, shared with them; the chat and
//! checkpoint targets are one call each): nothing panics, and the seeds that are valid work. The test
//! command also runs this in the `overflow` profile (release with overflow checks).

use std::path::Path;

use tinynn_format::malformed_corpus::fuzz_corpus;
use tinynn_models::chat::{ChatTemplate, Message};
use tinynn_train::data::parse_messages;

#[path = "../../../fuzz/fuzz_targets/bodies.rs"]
mod bodies;

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
        if no_panic(&path, || bodies::tokenizer_gguf(&data)) {
            built += 1;
        }
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

#[test]
fn tokenizer_json_files() {
    let mut built = Vec::new();
    for (path, data) in fuzz_corpus("tokenizer_json") {
        if no_panic(&path, || bodies::tokenizer_json(&data)) {
            built.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    built.sort();
    // The sparse one (an id of 2^32 − 1 among two tokens) is refused.
    assert_eq!(built, ["tiny-llama.json", "unigram.json", "wordpiece.json"]);
}

#[test]
fn lora_adapters() {
    let model = tinynn_models::model::Model::open(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tinynn-models/tests/fixtures/tiny-llama"),
    )
    .unwrap();
    let mut applied = 0;
    for (path, data) in fuzz_corpus("lora_adapter") {
        if no_panic(&path, || bodies::lora_adapter(&model, &data)) {
            applied += 1;
        }
    }
    assert!(applied >= 1, "the seed adapter applies: {applied}");
}

#[test]
fn bin_data_files() {
    let mut read = Vec::new();
    for (path, data) in fuzz_corpus("bin_data") {
        if no_panic(&path, || bodies::bin_data(&data)) {
            read.push(path.file_name().unwrap().to_string_lossy().into_owned());
        }
    }
    // A partial id, an id outside the vocabulary, a negative id and a lone token are refused.
    assert_eq!(read, ["valid-seq8"]);
}
