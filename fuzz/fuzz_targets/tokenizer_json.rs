//! Any file offered as a Hugging Face `tokenizer.json`: an error, or a tokenizer whose ids are
//! dense and which encodes, decodes and streams — never a panic, never tables sized by one
//! number in the file.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| {
    // The tokenizers library panics on some malformed files; tinynn catches those panics and
    // returns an error. libFuzzer's panic hook would abort on the caught panic, so the default
    // hook goes back in: a panic that escapes still ends the run (the harness aborts on it).
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let _ = std::panic::take_hook();
    });
    bodies::tokenizer_json(data);
});
