//! Any bytes: the safetensors header parser returns an error or tensors that lie inside the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinynn_format::safetensors::SafetensorsHeader;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = SafetensorsHeader::parse(data) else {
        return;
    };
    for t in &h.tensors {
        let end = t.data_start.checked_add(t.n_bytes).expect("no overflow");
        assert!(end <= data.len());
    }
});
