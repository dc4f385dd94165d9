//! Any GGUF file's vocabulary: building the tokenizer (byte-level BPE or SentencePiece with
//! merges derived from the pieces) and the per-token byte table is an error or a tokenizer
//! that encodes and decodes, never a panic, and never time or memory beyond the caps.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| {
    bodies::tokenizer_gguf(data);
});
