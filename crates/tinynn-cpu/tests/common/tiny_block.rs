//! A tiny Llama/Qwen-style block for autograd tests: embedding, RMSNorm, q/k/v (q bias),
//! NEOX RoPE, causal GQA flash attention, SwiGLU MLP, output head, cross-entropy. The training
//! forward pass has no KV cache.

use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use super::{Input, Rng};

const F32: GgmlType = GgmlType::F32;
const I32: GgmlType = GgmlType::I32;

/// Sizes of the tiny block.
pub const E: usize = 8;
pub const V: usize = 11;
const NH: usize = 2;
const NKV: usize = 1;
const HD: usize = 4;
const FF: usize = 12;
pub const N: usize = 5;

pub fn causal_mask(n: usize) -> Vec<f32> {
    (0..n * n)
        .map(|i| {
            if i % n > i / n {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect()
}

/// Parameter shapes and random values, in the order `block` reads them.
pub fn params(rng: &mut Rng) -> Vec<(Vec<usize>, Vec<f32>)> {
    let shapes: [&[usize]; 13] = [
        &[E, V],       // token embedding
        &[E],          // attn norm
        &[E, NH * HD], // wq
        &[NH * HD],    // q bias (Qwen2)
        &[E, NKV * HD],
        &[E, NKV * HD],
        &[NH * HD, E], // wo
        &[E],          // ffn norm
        &[E, FF],      // gate
        &[E, FF],      // up
        &[FF, E],      // down
        &[E],          // output norm
        &[E, V],       // output head
    ];
    shapes
        .iter()
        .map(|s| (s.to_vec(), rng.vec(s.iter().product())))
        .collect()
}

/// The block's mean cross-entropy (or its logits `[V, N]` when `with_loss` is false) and the
/// inputs to write (tokens, positions, labels with one masked, causal mask).
pub fn block(g: &mut Graph, p: &[TensorId], with_loss: bool) -> (TensorId, Vec<Input>) {
    let tokens = g.input("tokens", I32, &[N]).unwrap();
    let pos = g.input("pos", I32, &[N]).unwrap();
    let labels = g.input("labels", I32, &[N]).unwrap();
    let mask = g.input("mask", F32, &[N, N]).unwrap();
    let rope = Rope::new(RopeMode::Neox, HD, 10000.0);
    let x = g.get_rows(p[0], tokens).unwrap(); // [E, N]
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, p[1]).unwrap();
    let q = g.mul_mat(p[2], h).unwrap(); // [NH·HD, N]
    let q = g.add(q, p[3]).unwrap();
    let q = g.reshape(q, &[HD, NH, N]).unwrap();
    let q = g.rope(q, pos, rope).unwrap();
    let k = g.mul_mat(p[4], h).unwrap();
    let k = g.reshape(k, &[HD, NKV, N]).unwrap();
    let k = g.rope(k, pos, rope).unwrap();
    let v = g.mul_mat(p[5], h).unwrap();
    let v = g.reshape(v, &[HD, NKV, N]).unwrap();
    let q = g.permute(q, [0, 2, 1, 3]).unwrap(); // [HD, N, NH]
    let k = g.permute(k, [0, 2, 1, 3]).unwrap(); // [HD, N, NKV]
    let v = g.permute(v, [0, 2, 1, 3]).unwrap();
    let att = g
        .flash_attn(q, k, v, Some(mask), None, 1.0 / (HD as f32).sqrt(), 0.0)
        .unwrap(); // [HD, NH, N]
    let att = g.reshape(att, &[NH * HD, N]).unwrap();
    let o = g.mul_mat(p[6], att).unwrap();
    let x = g.add(x, o).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, p[7]).unwrap();
    let gate = g.mul_mat(p[8], h).unwrap();
    let up = g.mul_mat(p[9], h).unwrap();
    let act = g.swiglu(gate, up).unwrap();
    let down = g.mul_mat(p[10], act).unwrap();
    let x = g.add(x, down).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, p[11]).unwrap();
    let logits = g.mul_mat(p[12], h).unwrap(); // [V, N]
    let y = if with_loss {
        g.cross_entropy_loss(logits, labels).unwrap()
    } else {
        logits
    };
    (
        y,
        vec![
            Input::I32(tokens, vec![3, 1, 4, 1, 5]),
            Input::I32(pos, (0..N as i32).collect()),
            Input::I32(labels, vec![1, 4, 1, 5, -1]),
            Input::F32(mask, causal_mask(N)),
        ],
    )
}
