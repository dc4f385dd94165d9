//! Any file offered as a training checkpoint: loaded and fully checked (counts, types, shapes,
//! metadata and tensor checksums) or refused with an error — never a panic, never an
//! allocation sized by an unchecked count.
#![no_main]

use std::io::Write;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut f) = tempfile::NamedTempFile::new() else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    let _ = tinynn_train::checkpoint::load(f.path());
});
