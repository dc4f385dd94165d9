//! The real SmolLM2-135M-Instruct Q4_1 file: its facts, and a byte-exact write/read round trip.

use tinynn_format::gguf::{Gguf, GgufFile, GgufWriter, Key};
use tinynn_format::model_cache::require_default_model;
use tinynn_format::model_config::{Architecture, ModelConfig};
use tinynn_format::GgmlType;

#[test]
fn smollm2_facts() {
    let file = GgufFile::open(require_default_model().unwrap()).unwrap();
    let g = file.gguf();
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.tensors().len(), 272);
    let params: u64 = g.tensors().iter().map(|t| t.n_elements).sum();
    assert_eq!(params, 134_515_008);
    let c = ModelConfig::from_gguf(g).unwrap();
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim),
        (30, 576, 9, 3, 64)
    );
    assert_eq!(
        (c.n_ff, c.n_vocab, c.n_ctx_train),
        (Some(1536), Some(49152), Some(8192))
    );
    assert_eq!(c.norm_eps, Some(1e-5));
    assert_eq!(c.rope_freq_base, Some(100_000.0));
    assert_eq!(c.tie_word_embeddings, Some(true));
    assert_eq!(g.get_str(Key::TokenizerModel).unwrap(), Some("gpt2"));
    assert_eq!(g.get_str(Key::TokenizerPre).unwrap(), Some("smollm"));
    assert_eq!(
        g.get_array(Key::TokenizerTokens).unwrap().map(|a| a.len()),
        Some(49152)
    );
    assert!(g
        .get_str(Key::TokenizerChatTemplate)
        .unwrap()
        .unwrap()
        .contains("<|im_start|>"));
    let q = file.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(
        (q.ggml_type(), q.info.dims.as_slice()),
        (GgmlType::Q4_1, &[576u64, 576][..])
    );
    assert_eq!(q.data.len(), 576 * 576 / 32 * 20);
    // Zero copy: the view points into the map.
    let map = file.bytes().as_ptr_range();
    assert!(map.contains(&q.data.as_ptr()));
}

#[test]
fn smollm2_round_trip_is_exact() {
    let file = GgufFile::open(require_default_model().unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("copy.gguf");
    GgufWriter::from_gguf(file.gguf(), file.bytes())
        .unwrap()
        .write_atomic(&out)
        .unwrap();
    let copy = GgufFile::open(&out).unwrap();
    let (a, b): (&Gguf, &Gguf) = (file.gguf(), copy.gguf());
    assert_eq!(a.metadata().len(), b.metadata().len());
    for (x, y) in a.metadata().iter().zip(b.metadata()) {
        assert_eq!(x.key, y.key);
        assert!(x.value.bit_eq(&y.value), "metadata {} differs", x.key);
    }
    assert_eq!(a.tensors(), b.tensors());
    let mut identical = 0;
    for (x, y) in file.tensors().zip(copy.tensors()) {
        assert_eq!(x.info.name, y.info.name);
        assert!(x.data == y.data, "tensor {} differs", x.info.name);
        identical += 1;
    }
    assert_eq!(identical, 272);
}
