//! A small file whose metadata claims a huge model (every size within the config limits, the
//! tensors tiny) is refused before the trainer sizes parameters, gradients or optimizer
//! moments from the config: the error names the tensor and both shapes. Before this check, full
//! fine-tuning planned terabytes of gradients from such a file and the process aborted.

use tinynn_format::gguf::{GgufFile, GgufWriter, Key, Value};
use tinynn_format::GgmlType;
use tinynn_train::{LoraConfig, Targets, TrainConfig, TrainSource, Trainer};

fn hostile_gguf(path: &std::path::Path) {
    let data = vec![0u8; 64 * 100 * 4];
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    w.set_key(Key::BlockCount, Value::U32(1)).unwrap();
    w.set_key(Key::EmbeddingLength, Value::U32(1 << 20))
        .unwrap();
    w.set_key(Key::FeedForwardLength, Value::U32(1 << 20))
        .unwrap();
    w.set_key(Key::HeadCount, Value::U32(2048)).unwrap();
    w.set_key(Key::VocabSize, Value::U32(100)).unwrap();
    for name in [
        "token_embd.weight",
        "output_norm.weight",
        "blk.0.attn_norm.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_k.weight",
        "blk.0.attn_v.weight",
        "blk.0.attn_output.weight",
        "blk.0.ffn_norm.weight",
        "blk.0.ffn_gate.weight",
        "blk.0.ffn_up.weight",
        "blk.0.ffn_down.weight",
    ] {
        w.add_tensor(name, GgmlType::F32, &[64, 100], &data)
            .unwrap();
    }
    w.write_atomic(path).unwrap();
}

#[test]
fn a_tiny_file_claiming_a_huge_model_is_refused_before_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hostile.gguf");
    hostile_gguf(&path);
    let file = GgufFile::open(&path).unwrap();
    let full = TrainConfig {
        seq: 8,
        batch: 1,
        ..TrainConfig::default()
    };
    let lora = TrainConfig {
        lora: Some(LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: Targets::parse("q,v").unwrap(),
            seed: 1,
        }),
        ..full
    };
    for cfg in [full, lora] {
        let err = match Trainer::new(TrainSource::from(&file), cfg) {
            Ok(_) => panic!("a 1-layer file of 64×100 tensors trained as a 2^20-wide model"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("the source has dims") && err.contains("the config implies"),
            "{err}"
        );
    }
}
