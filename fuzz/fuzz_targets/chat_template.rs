//! Any chat template (the bytes before the first NUL) rendering any conversation (the JSONL
//! line after it, or a fixed one): an error or text, never a panic, a hang or unbounded output
//! (the sandbox's fuel, recursion and output limits).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinynn_models::chat::{ChatTemplate, Message};

fuzz_target!(|data: &[u8]| {
    let (tpl, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[][..]),
    };
    let Ok(source) = std::str::from_utf8(tpl) else {
        return;
    };
    let messages = std::str::from_utf8(rest)
        .ok()
        .and_then(|l| tinynn_train::data::parse_messages(l).ok())
        .unwrap_or_else(|| {
            vec![
                Message::new("system", "Be brief."),
                Message::new("user", "Hello"),
                Message::new("assistant", "Hi!"),
                Message::new("user", "And?"),
            ]
        });
    let t = ChatTemplate::new(source.to_string(), "<s>", "</s>");
    for gen in [false, true] {
        let _ = t.render(&messages, gen);
    }
});
