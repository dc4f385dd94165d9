//! Any file offered as pre-tokenized training data (`.bin`, little-endian i32 ids), with a
//! sequence length and vocabulary taken from the first three bytes: refused with an error
//! (empty, a partial id, an id outside the vocabulary) or read sequence by sequence — never a
//! panic.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;
use tinynn_train::data::{BinTokens, Sequences};

fuzz_target!(|data: &[u8]| {
    let [s, v0, v1, rest @ ..] = data else {
        return;
    };
    let seq = usize::from(*s % 64);
    let vocab = usize::from(u16::from_le_bytes([*v0, *v1]));
    let Ok(mut f) = tempfile::NamedTempFile::new() else {
        return;
    };
    if f.write_all(rest).is_err() {
        return;
    }
    let Ok(bin) = BinTokens::open(&[f.path().to_path_buf()], seq, vocab) else {
        return;
    };
    if bin.check_all().is_err() {
        return;
    }
    let mut inputs = vec![0i32; bin.seq_len()];
    let mut labels = vec![0i32; bin.seq_len()];
    for i in 0..bin.len().min(64) {
        let _ = bin.read(i, &mut inputs, &mut labels);
    }
});
