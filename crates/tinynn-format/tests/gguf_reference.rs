//! A GGUF written by gguf-py (llama.cpp's Python writer, `scripts/make-gguf-fixture.py`) reads back
//! with every value the script wrote, and our writer reproduces the file byte for byte.

use tinynn_format::gguf::{Array, Gguf, GgufString, GgufWriter, Key, Value};
use tinynn_format::model_config::{Architecture, ModelConfig};
use tinynn_format::GgmlType;

const FIXTURE: &[u8] = include_bytes!("fixtures/gguf_py_reference.gguf");

fn strings(v: &[&str]) -> Array {
    Array::String(v.iter().map(|s| GgufString::from(*s)).collect())
}

#[test]
fn gguf_py_values_read_back() {
    let g = Gguf::parse(FIXTURE).unwrap();
    assert_eq!((g.version(), g.alignment()), (3, 64));
    let expect = [
        ("ref.u8", Value::U8(200)),
        ("ref.i8", Value::I8(-100)),
        ("ref.u16", Value::U16(60000)),
        ("ref.i16", Value::I16(-30000)),
        ("ref.i32", Value::I32(-2_000_000_000)),
        ("ref.f32", Value::F32(3.5)),
        ("ref.u64", Value::U64((1 << 63) + 5)),
        ("ref.i64", Value::I64(-(1 << 62))),
        ("ref.f64", Value::F64(2f64.powi(-40))),
        ("ref.bool", Value::Bool(false)),
        ("ref.string", Value::String(GgufString::from("naïve ✓"))),
        ("ref.ints", Value::Array(Array::I32(vec![1, 2, 3]))),
        ("ref.floats", Value::Array(Array::F32(vec![0.25, -1.5]))),
        ("ref.strings", Value::Array(strings(&["a", "", "ü"]))),
        (
            "ref.nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::I32(vec![3]),
            ])),
        ),
        (
            "tokenizer.ggml.tokens",
            Value::Array(strings(&["<s>", "</s>", "hi"])),
        ),
    ];
    for (key, value) in expect {
        assert_eq!(g.get_raw(key), Some(&value), "{key}");
    }
    assert_eq!(
        g.get_str(Key::GeneralName).unwrap(),
        Some("reference fixture")
    );
    let c = ModelConfig::from_gguf(&g).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen2);
    assert_eq!(
        (c.n_ctx_train, c.n_embd, c.n_layer, c.n_head, c.n_head_kv),
        (Some(4096), 64, 2, 4, 2)
    );
    assert_eq!(
        (c.rope_freq_base, c.norm_eps, c.n_vocab),
        (Some(1e6), Some(1e-6), Some(3))
    );

    // gguf-py stores numpy shapes reversed: ggml dims[0] is the row length.
    let f32 = g.tensor_info("t.f32").unwrap();
    assert_eq!(
        (f32.ggml_type, f32.dims.as_slice()),
        (GgmlType::F32, &[4u64, 3][..])
    );
    let data = g.tensor_data(FIXTURE, f32).unwrap();
    let values: Vec<f32> = data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(values, (0..12).map(|i| i as f32).collect::<Vec<_>>());
    let f16 = g.tensor_info("t.f16").unwrap();
    assert_eq!(
        (f16.ggml_type, f16.dims.as_slice(), f16.n_bytes),
        (GgmlType::F16, &[4u64, 2][..], 16)
    );
    // 0.25 in f16 is 0x3400.
    assert_eq!(
        &g.tensor_data(FIXTURE, f16).unwrap()[2..4],
        &0x3400u16.to_le_bytes()
    );
    let q8 = g.tensor_info("t.q8_0").unwrap();
    assert_eq!(
        (q8.ggml_type, q8.dims.as_slice(), q8.n_bytes),
        (GgmlType::Q8_0, &[64u64, 1][..], 68)
    );
    assert_eq!(
        g.tensor_data(FIXTURE, q8).unwrap(),
        (0..68).collect::<Vec<u8>>()
    );
    for t in g.tensors() {
        assert_eq!(
            t.offset % 64,
            0,
            "{} is aligned to general.alignment",
            t.name
        );
    }
}

#[test]
fn our_writer_reproduces_the_gguf_py_file() {
    let g = Gguf::parse(FIXTURE).unwrap();
    let mut out = Vec::new();
    GgufWriter::from_gguf(&g, FIXTURE)
        .unwrap()
        .write_to(&mut out)
        .unwrap();
    assert_eq!(out, FIXTURE);
}
