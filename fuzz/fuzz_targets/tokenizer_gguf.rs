//! Any GGUF file's vocabulary: building the tokenizer (byte-level BPE or SentencePiece with
//! merges derived from the pieces) and the per-token byte table is an error or a tokenizer
//! that encodes and decodes, never a panic, and never time or memory beyond the caps.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinynn_format::gguf::Gguf;
use tinynn_models::tokenizer::Tokenizer;
use tinynn_models::vocab::Vocab;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data) else {
        return;
    };
    let _ = Vocab::from_gguf(&g);
    let Ok(tok) = Tokenizer::from_gguf(&g) else {
        return;
    };
    if let Ok(ids) = tok.encode("Hello wörld 12345 🦀 <s>", true) {
        let _ = tok.decode(&ids);
        let mut s = tok.text_stream(&ids[..ids.len().min(2)]);
        for &id in &ids {
            let _ = s.step(&tok, id);
        }
        let _ = s.finish(&tok);
    }
});
