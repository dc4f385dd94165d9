//! Any file offered as a LoRA adapter for the tiny Llama fixture: refused with an error (not an
//! adapter, wrong architecture, pairs that do not fit the model), or applied in a session that
//! decodes a token — never a panic.
#![no_main]

use std::io::Write;
use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use tinynn_models::lora::{AppliedLora, LoraAdapter};
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};

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
    let Ok(mut f) = tempfile::NamedTempFile::new() else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    let Ok(adapter) = LoraAdapter::open(f.path()) else {
        return;
    };
    let model = base();
    if adapter.check_base(&model.source()).is_err() {
        return;
    }
    let opts = SessionOptions {
        n_ctx: 8,
        lora: vec![AppliedLora::new(adapter, 0.5)],
        ..SessionOptions::default()
    };
    if let Ok(mut s) = Session::with_options(model.clone(), opts) {
        let _ = s.eval_batch(&[1, 2, 3]);
    }
});
