//! Any file offered as a Hugging Face `tokenizer.json`: an error, or a tokenizer whose ids are
//! dense and which encodes, decodes and streams — never a panic, never tables sized by one
//! number in the file.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use tinynn_models::tokenizer::Tokenizer;

fuzz_target!(|data: &[u8]| {
    // The tokenizers library panics on some malformed files; tinynn catches those panics and
    // returns an error. libFuzzer's panic hook would abort on the caught panic, so the default
    // hook goes back in: a panic that escapes still ends the run (the harness aborts on it).
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let _ = std::panic::take_hook();
    });
    let Ok(mut f) = tempfile::NamedTempFile::new() else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    let Ok(tok) = Tokenizer::from_hf_file(f.path(), None, None) else {
        return;
    };
    let _ = tok.vocab_kind();
    if let Ok(ids) = tok.encode("Hello wörld 12345 🦀 <s>", true) {
        let _ = tok.decode(&ids);
        let mut s = tok.text_stream(&ids[..ids.len().min(2)]);
        for &id in &ids {
            let _ = s.step(&tok, id);
        }
        let _ = s.finish(&tok);
    }
});
