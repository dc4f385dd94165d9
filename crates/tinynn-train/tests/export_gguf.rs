//! GGUF round trip: a random-init model written as an F16 GGUF loads into a trainer (dequantized
//! to f32 masters), trains, and exports (F32 and F16) with the source's metadata; the export
//! loads in the inference engine and scores the text as the trainer does.

use std::path::Path;

use tinynn_cpu::ExecOptions;
use tinynn_format::gguf::GgufFile;
use tinynn_format::GgmlType;
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};
use tinynn_train::{TrainConfig, TrainError, Trainer};

mod common;

use common::tiny_llama::{self, V};

const SEQ: usize = 16;

fn cfg() -> TrainConfig {
    TrainConfig {
        seq: SEQ,
        batch: 1,
        threads: 2,
        ..TrainConfig::default()
    }
}

/// Writes `t`'s weights as an F16 GGUF with Llama metadata (and a marker key).
fn write_source(t: &Trainer, path: &Path) {
    tiny_llama::write_gguf(t, path, GgmlType::F16, &[("test.marker", "kept")]);
}

#[test]
fn a_trained_model_exports_to_gguf_that_inference_loads() {
    let dir = tempfile::tempdir().unwrap();
    let random = Trainer::new(tiny_llama::random(48, 5), cfg()).unwrap();
    // Random init: normal(0, 0.02) matrices, unit norms.
    let p = random.params().unwrap();
    let emb = &p[0].data;
    let std = (emb.iter().map(|x| x * x).sum::<f32>() / emb.len() as f32).sqrt();
    assert!((std - 0.02).abs() < 0.002, "init std {std}");
    assert!(p[1].data.iter().all(|&x| x == 1.0));
    assert!(matches!(
        random.export_gguf(&dir.path().join("x.gguf"), GgmlType::F32),
        Err(TrainError::Unsupported(_))
    ));

    let src = dir.path().join("source.gguf");
    write_source(&random, &src);
    let file = GgufFile::open(&src).unwrap();
    let mut t = Trainer::new(&file, cfg()).unwrap();
    // F16 weights were dequantized: each master equals its f16 rounding.
    let loaded = t.params().unwrap();
    let e0 = &loaded[0].data;
    assert!(e0
        .iter()
        .zip(emb)
        .all(|(a, b)| (a - b).abs() <= 1e-3 * b.abs() + 1e-7));
    assert_eq!(t.param_specs().len(), 2 + 2 * 9, "tied: no output.weight");

    let ids: Vec<i32> = (0..SEQ as i32).map(|i| (i * 7 + 3) % V as i32).collect();
    let labels: Vec<i32> = ids[1..].iter().copied().chain([-1]).collect();
    let first = t.step(&ids, &labels, 1e-2).unwrap().loss;
    for _ in 0..4 {
        t.step(&ids, &labels, 1e-2).unwrap();
    }
    let trained = t.eval_loss(&ids, &labels).unwrap();
    assert!(trained < first, "{first} → {trained}");

    for ty in [GgmlType::F32, GgmlType::F16] {
        let out = dir.path().join(format!("trained-{ty}.gguf"));
        t.export_gguf(&out, ty).unwrap();
        let f = GgufFile::open(&out).unwrap();
        assert_eq!(
            f.gguf().get_raw("test.marker").and_then(|v| v.as_str()),
            Some("kept")
        );
        let params = t.params().unwrap();
        if ty == GgmlType::F32 {
            for p in &params {
                let view = f.tensor(&p.name).unwrap();
                let got: Vec<f32> = view
                    .data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                assert_eq!(got, p.data, "{}", p.name);
            }
        }
        // The inference engine scores the sequence as the trainer does.
        let opts = ExecOptions {
            strict: true,
            ..ExecOptions::default()
        };
        let so = SessionOptions {
            n_ctx: 64,
            exec: opts,
            all_logits: true,
            ..SessionOptions::default()
        };
        let mut s = Session::with_options(Model::open(&out).unwrap(), so).unwrap();
        let tokens: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
        s.eval_batch(&tokens).unwrap();
        let logits = s.all_logits();
        let mut nll = 0f64;
        for (i, &l) in labels.iter().enumerate().take(SEQ - 1) {
            let row = &logits[i * V..(i + 1) * V];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let z: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
            nll += z.ln() - f64::from(row[l as usize] - max);
        }
        let loss = (nll / (SEQ - 1) as f64) as f32;
        let tol = if ty == GgmlType::F32 { 1e-4 } else { 1e-2 };
        println!("{ty} export: inference loss {loss}, trainer {trained}");
        assert!(
            (loss - trained).abs() <= tol * trained,
            "{ty}: {loss} vs {trained}"
        );
    }
}
