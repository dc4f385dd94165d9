//! Any bytes: the GGUF reader returns a typed error or a header whose every tensor lies inside
//! the input; an accepted file survives write → read with identical metadata and tensor bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tinynn_format::gguf::{Gguf, GgufWriter};
use tinynn_format::model_config::ModelConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::parse(data) else { return };
    let _ = ModelConfig::from_gguf(&g);
    let _ = g.split();
    for t in g.tensors() {
        let bytes = g
            .tensor_data(data, t)
            .expect("accepted tensors lie inside the file");
        assert_eq!(bytes.len() as u64, t.n_bytes);
    }
    let mut out = Vec::new();
    GgufWriter::from_gguf(&g, data)
        .expect("an accepted file can be rewritten")
        .write_to(&mut out)
        .expect("writing to memory succeeds");
    let again = Gguf::parse(&out).expect("what we write we can read");
    assert_eq!(g.metadata().len(), again.metadata().len());
    for (a, b) in g.metadata().iter().zip(again.metadata()) {
        assert!(a.key == b.key && a.value.bit_eq(&b.value));
    }
    for (a, b) in g.tensors().iter().zip(again.tensors()) {
        assert_eq!(
            (&a.name, &a.dims, a.ggml_type),
            (&b.name, &b.dims, b.ggml_type)
        );
        assert_eq!(g.tensor_data(data, a), again.tensor_data(&out, b));
    }
});
