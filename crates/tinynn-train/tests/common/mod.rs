//! Shared by the parity tests: the committed PyTorch fixtures (scripts/make-train-fixtures.py).
#![allow(dead_code)]

pub mod tiny_llama;

use std::collections::HashMap;
use std::path::PathBuf;

use tinynn_format::safetensors::SafetensorsFile;
use tinynn_train::{Optimizer, TrainConfig};

pub fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// expected.json of a fixture.
pub struct Expected {
    pub batch: usize,
    pub seq: usize,
    pub ids: Vec<i32>,
    pub labels: Vec<i32>,
    pub loss: f32,
    pub adamw_losses: Vec<f32>,
}

pub fn expected(name: &str) -> Expected {
    let text = std::fs::read_to_string(fixture_dir(name).join("expected.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let ints = |k: &str| -> Vec<i32> {
        v[k].as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_i64().unwrap() as i32)
            .collect()
    };
    Expected {
        batch: v["batch"].as_u64().unwrap() as usize,
        seq: v["seq"].as_u64().unwrap() as usize,
        ids: ints("ids"),
        labels: ints("labels"),
        loss: v["loss"].as_f64().unwrap() as f32,
        adamw_losses: v["adamw_losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect(),
    }
}

/// PyTorch's gradients by GGUF name (flat, in PyTorch's row-major order = ggml's).
pub fn torch_grads(name: &str) -> HashMap<String, Vec<f32>> {
    let f = SafetensorsFile::open(fixture_dir(name).join("grads.safetensors")).unwrap();
    f.tensors()
        .iter()
        .map(|t| {
            let data = f
                .tensor_data(t)
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (t.name.clone(), data)
        })
        .collect()
}

/// The fixture's AdamW (lr 1e-3 given per step, betas 0.9/0.999, eps 1e-8, wd 0.01).
pub fn train_config(e: &Expected, threads: usize, strict: bool) -> TrainConfig {
    TrainConfig {
        seq: e.seq,
        batch: e.batch,
        accum: 1,
        optimizer: Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        },
        clip: None,
        threads,
        strict,
        trace: false,
        lora: None,
        bf16_matmul: false,
        ..TrainConfig::default()
    }
}

/// max|a − b| / max|b|; NaN when either holds a NaN (so every tolerance check fails).
#[allow(unused_imports)] // not every test binary that shares this module compares tensors
pub use tinynn_core::measure::rel_err;
