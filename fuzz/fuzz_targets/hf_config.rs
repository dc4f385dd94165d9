//! Any text: config.json parsing and the derived model config return errors, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinynn_format::hf_config::HfConfig;
use tinynn_format::model_config::ModelConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(c) = HfConfig::from_json(text) {
        let _ = ModelConfig::from_hf(&c);
    }
});
