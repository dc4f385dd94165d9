//! A vocabulary with more tokens than the token embedding has rows is refused when the
//! tokenizer is asked for (before, token ids past the last row failed only at decode time,
//! as an index error); the rest of the model (inspect) still opens.

use tinynn_format::gguf::{Array, Gguf, GgufString, GgufWriter, Value};
use tinynn_format::model_cache::require_default_model;
use tinynn_models::model::Model;

#[test]
fn more_tokens_than_embedding_rows_is_a_clear_error() {
    let path = require_default_model().unwrap();
    let model = Model::open(&path).unwrap();
    assert!(
        model.tokenizer().is_ok(),
        "the real model's vocabulary fits"
    );
    let rows = 49152;

    let bytes = std::fs::read(&path).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    let mut w = GgufWriter::from_gguf(&g, &bytes).unwrap();
    let extra = 10;
    let mut tokens = match g.get_raw("tokenizer.ggml.tokens") {
        Some(Value::Array(Array::String(v))) => v.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(tokens.len(), rows);
    tokens.extend((0..extra).map(|i| GgufString::from(format!("<extra_{i}>").as_str())));
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)));
    if let Some(Value::Array(Array::I32(types))) = g.get_raw("tokenizer.ggml.token_type") {
        let mut types = types.clone();
        types.extend(std::iter::repeat_n(1, extra));
        w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("more-tokens.gguf");
    w.write_atomic(&bad).unwrap();

    let m = Model::open(&bad).expect("the model itself still opens (inspect works)");
    let err = m.tokenizer().err().expect("refused").to_string();
    assert!(
        err.contains(&format!("{} tokens", rows + extra)) && err.contains(&format!("{rows} rows")),
        "{err}"
    );
    assert!(m.vocab().is_err());
}
