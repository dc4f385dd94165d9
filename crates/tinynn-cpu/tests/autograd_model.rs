//! Autograd on whole graphs: a Llama/Qwen-style block (embedding, RMSNorm, q/k/v with bias,
//! NEOX RoPE, causal GQA flash attention, SwiGLU MLP, output head, cross-entropy) checked
//! against central differences for every parameter; a wrong rule swapped in is caught by the
//! checker; gradients that cannot flow give typed errors.

mod common;

use common::gradcheck::{assert_grads_with, grad_check, Built, Opts, P};
use common::{Input, Rng};
use tinynn_core::graph::{Contributions, Graph};
use tinynn_core::ops::{Binary, Op, Rope, RopeMode, Unary};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;
const I32: GgmlType = GgmlType::I32;

/// Sizes of the tiny block.
const E: usize = 8;
const V: usize = 11;
const NH: usize = 2;
const NKV: usize = 1;
const HD: usize = 4;
const FF: usize = 12;
const N: usize = 5;

fn causal_mask(n: usize) -> Vec<f32> {
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

/// Parameter shapes, in the order `block` reads them.
fn block_params(rng: &mut Rng) -> Vec<P> {
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
    shapes.iter().map(|s| P::rand(s, rng)).collect()
}

/// The training forward pass of one Llama-family block (no KV cache), as in
/// `tinynn-models/src/llama.rs`, ending in the mean cross-entropy.
fn block(g: &mut Graph, p: &[TensorId]) -> Built {
    block_to(g, p, true)
}

/// [`block`] with the logits as the output instead of the loss (`with_loss` false): the
/// checker then sums many f32 outputs in f64, which allows a smaller step.
fn block_to(g: &mut Graph, p: &[TensorId], with_loss: bool) -> Built {
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
    Built::with(
        y,
        vec![
            Input::I32(tokens, vec![3, 1, 4, 1, 5]),
            Input::I32(pos, (0..N as i32).collect()),
            Input::I32(labels, vec![1, 4, 1, 5, -1]),
            Input::F32(mask, causal_mask(N)),
        ],
    )
}

fn loss_opts<'a>() -> Opts<'a> {
    // The loss is one f32: a larger step keeps its rounding small next to the difference,
    // at the price of more truncation error.
    Opts {
        h: 1e-2,
        tol: 5e-3,
        ..Opts::default()
    }
}

#[test]
fn llama_block_gradients_match_finite_differences() {
    let ps = block_params(&mut Rng::new(21));
    let logits = |g: &mut Graph, p: &[TensorId]| block_to(g, p, false);
    assert_grads_with("llama block (logits)", &ps, &logits, &Opts::default());
    assert_grads_with("llama block (loss)", &ps, &block, &loss_opts());
}

#[test]
fn a_wrong_rule_is_caught() {
    let mut rng = Rng::new(22);
    // Silu's derivative replaced by tanh's.
    let wrong_silu = |g: &mut Graph, id: TensorId, dy: TensorId, _: &[bool]| {
        let node = g.node(id).clone();
        (node.op == Op::Unary(Unary::Silu)).then(|| -> tinynn_core::graph::Result<Contributions> {
            Ok(vec![Some(g.unary_back(Unary::Tanh, node.src[0], dy)?)])
        })
    };
    let ps = [P::rand(&[7, 3], &mut rng)];
    let silu = |g: &mut Graph, p: &[TensorId]| Built::y(g.silu(p[0]).unwrap());
    let wrong = Opts {
        rule_override: Some(&wrong_silu),
        ..Opts::default()
    };
    let e = grad_check("silu, wrong rule", &ps, &silu, &wrong).unwrap_err();
    assert!(e.contains("is off by"), "{e}");
    assert!(grad_check("silu", &ps, &silu, &Opts::default()).is_ok());

    // Mul's operands swapped in its rule, deep inside the Llama block.
    let swapped_mul = |g: &mut Graph, id: TensorId, dy: TensorId, _: &[bool]| {
        let node = g.node(id).clone();
        (node.op == Op::Binary(Binary::Mul) && g.layout(node.src[1]).ne == [E, 1, 1, 1]).then(
            || -> tinynn_core::graph::Result<Contributions> {
                let da = g.mul(dy, node.src[1])?;
                let db = g.mul(dy, node.src[1])?; // should be dy·a, summed over tokens
                let db = g.reduce_to(db, &[E])?;
                Ok(vec![Some(da), Some(db)])
            },
        )
    };
    let ps = block_params(&mut Rng::new(21));
    let wrong = Opts {
        rule_override: Some(&swapped_mul),
        ..loss_opts()
    };
    let e = grad_check("llama block, wrong mul rule", &ps, &block, &wrong).unwrap_err();
    assert!(e.contains("p1") && e.contains("is off by"), "{e}");

    // A sign error in RMSNorm's rule.
    let negated = |g: &mut Graph, id: TensorId, dy: TensorId, _: &[bool]| {
        let node = g.node(id).clone();
        let Op::RmsNorm { eps } = node.op else {
            return None;
        };
        Some((|| -> tinynn_core::graph::Result<Contributions> {
            let d = g.rms_norm_back(node.src[0], dy, eps)?;
            Ok(vec![Some(g.scale(d, -1.0)?)])
        })())
    };
    let ps = [P::rand(&[9, 2], &mut rng)];
    let wrong = Opts {
        rule_override: Some(&negated),
        ..Opts::default()
    };
    let norm = |g: &mut Graph, p: &[TensorId]| Built::y(g.rms_norm(p[0], 1e-5).unwrap());
    assert!(grad_check("rms_norm, negated", &ps, &norm, &wrong).is_err());
}

#[test]
fn gradients_that_cannot_flow_are_typed_errors() {
    let mut g = Graph::new();
    let x = g.input("x", F32, &[4, 3]).unwrap();
    let w = g.weight("w", GgmlType::Q8_0, &[32, 4]).unwrap();
    let a = g.input("a", F32, &[32, 2]).unwrap();
    // Not a scalar.
    let e = g.backward(x, &[x]).unwrap_err();
    assert_eq!(e.op, "backward");
    // A quantized weight is not a parameter.
    let y = g.mul_mat(w, a).unwrap();
    let l = g.sum(y).unwrap();
    assert!(g.backward(l, &[w]).is_err());
    // ... but the activations still get their gradient through it.
    assert!(g.backward(l, &[a]).is_ok());
    // Through an op without a rule.
    let c = g.input("c", F32, &[3, 3]).unwrap();
    let conv = g.ssm_conv(x, c).unwrap();
    let l = g.sum(conv).unwrap();
    let e = g.backward(l, &[x]).unwrap_err();
    assert!(e.message.contains("not differentiable"), "{e}");
    // Integer outputs contribute nothing: rows picked by argmax still differentiate the table.
    let idx = g.argmax(x).unwrap();
    let rows = g.get_rows(x, idx).unwrap();
    let l = g.sum(rows).unwrap();
    assert!(g.backward(l, &[x]).is_ok());
    // Attention reading a KV cache through a run-time length is not part of training graphs.
    let q = g.input("q", F32, &[4, 2, 1]).unwrap();
    let kv_len = g.input("kv_len", I32, &[1]).unwrap();
    let att = g.flash_attn(q, q, q, None, Some(kv_len), 1.0, 0.0).unwrap();
    let l = g.sum(att).unwrap();
    let e = g.backward(l, &[q]).unwrap_err();
    assert!(e.message.contains("kv length"), "{e}");
}
