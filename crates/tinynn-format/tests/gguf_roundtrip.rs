//! The GGUF reader and writer agree with each other and with the format.

use tinynn_format::gguf::{Array, Gguf, GgufFile, GgufString, GgufWriter, Key, Value};
use tinynn_format::malformed_corpus::valid_small_file;
use tinynn_format::{Error, GgmlType};

#[test]
fn small_file_values_read_back_exactly() {
    let bytes = valid_small_file();
    let g = Gguf::parse(&bytes).expect("valid file");
    assert_eq!(g.version(), 3);
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.architecture(), Some("llama"));
    assert_eq!(g.get_raw("test.u8"), Some(&Value::U8(7)));
    assert_eq!(g.get_raw("test.i8"), Some(&Value::I8(-7)));
    assert_eq!(g.get_raw("test.u16"), Some(&Value::U16(700)));
    assert_eq!(g.get_raw("test.i16"), Some(&Value::I16(-700)));
    assert_eq!(g.get_raw("test.u32"), Some(&Value::U32(70_000)));
    assert_eq!(g.get_raw("test.i32"), Some(&Value::I32(-70_000)));
    assert_eq!(g.get_raw("test.f32"), Some(&Value::F32(0.5)));
    assert_eq!(g.get_raw("test.bool"), Some(&Value::Bool(true)));
    assert_eq!(
        g.get_raw("test.string").and_then(Value::as_str),
        Some("héllo")
    );
    assert_eq!(g.get_raw("test.u64"), Some(&Value::U64(1 << 40)));
    assert_eq!(g.get_raw("test.i64"), Some(&Value::I64(-(1 << 40))));
    assert_eq!(g.get_raw("test.f64"), Some(&Value::F64(-0.25)));
    let nested = Array::Array(vec![
        Array::I32(vec![1, 2]),
        Array::I32(vec![3]),
        Array::F32(vec![]),
    ]);
    assert_eq!(g.get_raw("test.nested"), Some(&Value::Array(nested)));
    let names: Vec<&str> = g.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["t.alpha", "t.beta", "t.gamma"]);
    let b = g.tensor_info("t.beta").unwrap();
    assert_eq!(
        (b.ggml_type, b.dims.as_slice(), b.n_elements, b.n_bytes),
        (GgmlType::Q4_0, &[32u64, 2][..], 64, 36)
    );
    // Offsets are padded to the alignment; data is where the writer put it.
    assert_eq!(
        g.tensors().iter().map(|t| t.offset).collect::<Vec<_>>(),
        [0, 32, 96]
    );
    assert_eq!(g.tensor_data(&bytes, b).unwrap(), &[2u8; 36][..]);
    assert_eq!(g.data_offset() + g.data_len(), bytes.len() as u64);
}

#[test]
fn write_read_write_is_byte_identical() {
    let bytes = valid_small_file();
    let g = Gguf::parse(&bytes).unwrap();
    let mut again = Vec::new();
    GgufWriter::from_gguf(&g, &bytes)
        .unwrap()
        .write_to(&mut again)
        .unwrap();
    assert_eq!(again, bytes);
}

#[test]
fn typed_keys_resolve_against_the_architecture() {
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "qwen2");
    w.set_key(Key::ContextLength, Value::U32(4096)).unwrap();
    w.set_key(Key::RopeFreqBase, Value::F32(1e6)).unwrap();
    w.set_key(
        Key::TokenizerChatTemplate,
        Value::String(GgufString::from("{{x}}")),
    )
    .unwrap();
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.get_raw("qwen2.context_length"), Some(&Value::U32(4096)));
    assert_eq!(g.get_u64(Key::ContextLength).unwrap(), Some(4096));
    assert_eq!(g.get_f64(Key::RopeFreqBase).unwrap(), Some(1e6));
    assert_eq!(
        g.get_str(Key::TokenizerChatTemplate).unwrap(),
        Some("{{x}}")
    );
    assert_eq!(g.get_u64(Key::BlockCount).unwrap(), None);
    // A key of the wrong type is an error naming the key and the byte where its value starts.
    let err = g.get_u64(Key::TokenizerChatTemplate).unwrap_err();
    assert_eq!(err.field, "tokenizer.chat_template");
    assert_eq!(err.kind.code(), "WrongValueType");
    let at = err.offset as usize;
    assert_eq!(&bytes[at..at + 8], &5u64.to_le_bytes());
    assert_eq!(&bytes[at + 8..at + 13], b"{{x}}");
}

#[test]
fn split_files_are_detected() {
    let mut w = GgufWriter::new();
    w.set("split.no", Value::U16(1));
    w.set("split.count", Value::U16(3));
    w.set("split.tensors.count", Value::I32(300));
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let s = Gguf::parse(&bytes).unwrap().split().unwrap().unwrap();
    assert_eq!((s.index, s.count, s.total_tensors), (1, 3, Some(300)));
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let data = [0u8; 40];
    let mut w = GgufWriter::new();
    assert!(
        w.add_tensor("t", GgmlType::Q4_0, &[32], &data[..17])
            .is_err(),
        "wrong byte count"
    );
    assert!(
        w.add_tensor("t", GgmlType::Q4_0, &[16], &data[..9])
            .is_err(),
        "partial block"
    );
    assert!(
        w.add_tensor("t", GgmlType::F32, &[0], &data[..0]).is_err(),
        "zero dim"
    );
    assert!(
        w.add_tensor("t", GgmlType::F32, &[1, 1, 1, 1, 1], &data[..4])
            .is_err(),
        "five dims"
    );
    assert!(
        w.add_tensor(&"n".repeat(64), GgmlType::F32, &[1], &data[..4])
            .is_err(),
        "long name"
    );
    w.add_tensor("t", GgmlType::Q4_0, &[32], &data[..18])
        .unwrap();
    assert!(
        w.add_tensor("t", GgmlType::F32, &[1], &data[..4]).is_err(),
        "duplicate"
    );
    w.set("general.alignment", Value::U32(24));
    assert!(
        w.write_to(&mut Vec::new()).is_err(),
        "alignment not a power of two"
    );
}

#[test]
fn atomic_write_replaces_the_file_and_leaves_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    std::fs::write(&path, b"old contents").unwrap();
    let bytes = valid_small_file();
    let g = Gguf::parse(&bytes).unwrap();
    let n = GgufWriter::from_gguf(&g, &bytes)
        .unwrap()
        .write_atomic(&path)
        .unwrap();
    assert_eq!(n, bytes.len() as u64);
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["out.gguf"]);
    let opened = GgufFile::open(&path).unwrap();
    assert_eq!(opened.tensor("t.gamma").unwrap().data, &[3u8; 32][..]);
}

#[test]
fn failed_atomic_write_leaves_the_old_file_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.gguf");
    std::fs::write(&path, b"old contents").unwrap();
    let mut w = GgufWriter::new();
    w.set("general.alignment", Value::U32(3));
    assert!(matches!(w.write_atomic(&path), Err(Error::Write(_))));
    assert_eq!(std::fs::read(&path).unwrap(), b"old contents");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn open_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.gguf");
    let msg = GgufFile::open(&missing).err().unwrap().to_string();
    assert!(msg.contains("missing.gguf"), "{msg}");
    let msg = GgufFile::open(dir.path()).err().unwrap().to_string();
    assert!(msg.contains("not a regular file"), "{msg}");
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\0\0\0").unwrap();
    let msg = GgufFile::open(&bad).err().unwrap().to_string();
    assert!(
        msg.contains("bad.gguf: invalid GGUF at byte 8 (header.n_tensors): file ends early"),
        "{msg}"
    );
}

/// Gemma-style attention keys: the sliding window, its pattern as a period or one flag per
/// layer, the window layers' RoPE base and the soft-caps; a pattern of the wrong length is
/// refused naming the key.
#[test]
fn attention_extras_are_read_from_gguf() {
    use tinynn_format::model_config::{ModelConfig, SwaPattern};
    let file = |pattern: Option<Value>| {
        let mut w = GgufWriter::new();
        w.set_str("general.architecture", "gemma2");
        for (k, v) in [
            (Key::EmbeddingLength, 8),
            (Key::BlockCount, 3),
            (Key::HeadCount, 2),
            (Key::FeedForwardLength, 16),
            (Key::SlidingWindow, 64),
        ] {
            w.set_key(k, Value::U32(v)).unwrap();
        }
        w.set_key(Key::RopeFreqBaseSwa, Value::F32(1e4)).unwrap();
        w.set_key(Key::AttnLogitSoftcapping, Value::F32(50.0))
            .unwrap();
        w.set_key(Key::FinalLogitSoftcapping, Value::F32(30.0))
            .unwrap();
        if let Some(p) = pattern {
            w.set_key(Key::SlidingWindowPattern, p).unwrap();
        }
        let mut bytes = Vec::new();
        w.write_to(&mut bytes).unwrap();
        ModelConfig::from_gguf(&Gguf::parse(&bytes).unwrap())
    };
    let c = file(None).unwrap();
    assert_eq!(c.attn.sliding_window, Some(64));
    assert_eq!(c.attn.swa_pattern, None);
    assert_eq!(c.attn.rope_freq_base_swa, Some(1e4));
    assert_eq!(
        (c.attn.attn_logit_softcap, c.attn.final_logit_softcap),
        (Some(50.0), Some(30.0))
    );
    let c = file(Some(Value::U32(2))).unwrap();
    assert_eq!(c.attn.swa_pattern, Some(SwaPattern::Period(2)));
    let flags = vec![true, false, true];
    let c = file(Some(Value::Array(Array::Bool(flags.clone())))).unwrap();
    assert_eq!(c.attn.swa_pattern, Some(SwaPattern::Layers(flags)));
    let e = file(Some(Value::Array(Array::Bool(vec![true]))))
        .unwrap_err()
        .to_string();
    assert!(e.contains("sliding window pattern is 1 flags"), "{e}");
    let e = file(Some(Value::String(GgufString::from("x"))))
        .unwrap_err()
        .to_string();
    assert!(e.contains("gemma2.attention.sliding_window_pattern"), "{e}");
}
