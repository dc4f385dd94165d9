//! Well-formed GGUF models with hostile hyperparameters, tensors and vocabularies, generated
//! from the fuzz input (`model_gguf_body.rs`), opened and decoded: never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "model_gguf_body.rs"]
mod body;

fuzz_target!(|data: &[u8]| {
    body::run(data);
});
