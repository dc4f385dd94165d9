//! Any file offered as a LoRA adapter for the tiny Llama fixture: refused with an error (not an
//! adapter, wrong architecture, pairs that do not fit the model), or applied in a session that
//! decodes a token — never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tinynn_models::model::Model;

#[path = "bodies.rs"]
mod bodies;

fn base() -> &'static Arc<Model> {
    static BASE: OnceLock<Arc<Model>> = OnceLock::new();
    BASE.get_or_init(|| {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../crates/tinynn-models/tests/fixtures/tiny-llama"
        );
        Model::open(dir).expect("the tiny-llama fixture opens")
    })
}

fuzz_target!(|data: &[u8]| {
    bodies::lora_adapter(base(), data);
});
