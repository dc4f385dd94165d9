//! Test helpers: deterministic random data, f64 reference comparison, and running a graph on
//! 1, 2 and 3 threads.

#![allow(dead_code)]

pub mod gradcheck;
pub mod tiny_block;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

/// Reproducible test data from the project's one generator.
pub struct Rng(tinynn_core::rng::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(tinynn_core::rng::Rng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        self.0.range_f32(-1.0, 1.0)
    }

    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// Normalized mean squared error: Σ(a−b)² / Σb².
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length");
    let err: f64 = got
        .iter()
        .zip(want)
        .map(|(&a, &b)| (f64::from(a) - b).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    if norm == 0.0 {
        err
    } else {
        err / norm
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Inputs to write before running: (tensor, values).
pub enum Input {
    F32(TensorId, Vec<f32>),
    I32(TensorId, Vec<i32>),
}

/// Compiles `g` (with `out` as output), runs it on `threads` threads with the given inputs and
/// weights bound, and returns the bytes of `out`.
fn run_bytes(
    g: &Graph,
    out: TensorId,
    inputs: &[Input],
    weights: &[(TensorId, &[u8])],
    threads: usize,
) -> Vec<u8> {
    let mut g = g.clone();
    g.set_output(out).unwrap();
    let plan = tinynn_cpu::compile(g);
    plan.verify().unwrap();
    let mut mem = Memory::new(&plan);
    for &(t, bytes) in weights {
        mem.bind_weight(&plan, t, bytes).unwrap();
    }
    for input in inputs {
        match input {
            Input::F32(t, v) => mem.write_f32(&plan, *t, v).unwrap(),
            Input::I32(t, v) => mem.write_i32(&plan, *t, v).unwrap(),
        }
    }
    let mut exec = Executor::new(&plan, threads);
    exec.run(&plan, &mut mem).unwrap();
    exec.bytes(&plan, &mem, out).unwrap().to_vec()
}

/// [`run_bytes`] for an F32 output.
pub fn run(
    g: &Graph,
    out: TensorId,
    inputs: &[Input],
    weights: &[(TensorId, &[u8])],
    threads: usize,
) -> Vec<f32> {
    let bytes = run_bytes(g, out, inputs, weights, threads);
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// [`run_bytes`] for an I32 output.
pub fn run_i32(g: &Graph, out: TensorId, inputs: &[Input], threads: usize) -> Vec<i32> {
    let bytes = run_bytes(g, out, inputs, &[], threads);
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Runs on 1, 2 and 3 threads and checks each result against `want` (NMSE ≤ `tol`).
pub fn check(
    what: &str,
    g: &Graph,
    out: TensorId,
    inputs: &[Input],
    weights: &[(TensorId, &[u8])],
    want: &[f64],
    tol: f64,
) {
    for threads in [1, 2, 3] {
        let got = run(g, out, inputs, weights, threads);
        let e = nmse(&got, want);
        assert!(e <= tol, "{what} ({threads} threads): NMSE {e:e} > {tol:e}");
    }
}

/// Index helper for contiguous reference arrays in ggml order.
pub fn idx(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

/// Weights of every supported type: quantized from random data where a quantizer exists,
/// random blocks with small scales otherwise (K-quants).
pub fn weight_bytes(ty: GgmlType, k: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    use tinynn_core::quant;
    if quant::has_quantizer(ty) {
        let mut out = vec![0u8; quant::row_bytes(ty, k * rows).unwrap()];
        quant::quantize_row(ty, &rng.vec(k * rows), &mut out).unwrap();
        return out;
    }
    let mut out: Vec<u8> = (0..quant::row_bytes(ty, k * rows).unwrap())
        .map(|_| rng.next_u64() as u8)
        .collect();
    let l = ty.layout();
    let offsets: &[usize] = match ty {
        GgmlType::Q2K => &[80, 82],
        GgmlType::Q3K => &[108],
        GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        _ => &[],
    };
    for b in out.chunks_exact_mut(l.block_bytes as usize) {
        for &o in offsets {
            b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    out
}
