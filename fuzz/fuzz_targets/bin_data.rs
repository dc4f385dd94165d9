//! Any file offered as pre-tokenized training data (`.bin`, little-endian i32 ids), with a
//! sequence length and vocabulary taken from the first three bytes: refused with an error
//! (empty, a partial id, an id outside the vocabulary) or read sequence by sequence — never a
//! panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "bodies.rs"]
mod bodies;

fuzz_target!(|data: &[u8]| {
    bodies::bin_data(data);
});
