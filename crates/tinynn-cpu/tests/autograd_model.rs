//! Autograd on whole graphs: a Llama/Qwen-style block (embedding, RMSNorm, q/k/v with bias,
//! NEOX RoPE, causal GQA flash attention, SwiGLU MLP, output head, cross-entropy) checked
//! against central differences for every parameter; a wrong rule swapped in is caught by the
//! checker; gradients that cannot flow give typed errors.

mod common;

use common::gradcheck::{assert_grads_with, grad_check, Built, Opts, P};
use common::Rng;
use tinynn_core::graph::{Contributions, Graph};
use tinynn_core::ops::{Binary, Op, Unary};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;
const I32: GgmlType = GgmlType::I32;

use common::tiny_block::{self, E};

fn block_params(rng: &mut Rng) -> Vec<P> {
    tiny_block::params(rng)
        .into_iter()
        .map(|(shape, values)| P { shape, values })
        .collect()
}

fn block(g: &mut Graph, p: &[TensorId]) -> Built {
    block_to(g, p, true)
}

fn block_to(g: &mut Graph, p: &[TensorId], with_loss: bool) -> Built {
    let (y, inputs) = tiny_block::block(g, p, with_loss);
    Built::with(y, inputs)
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
    // Central differences of f32 logits with h = 1e-3 land within 0.3–3.6e-3 of the analytic
    // gradients over 20 random blocks (a wrong rule is off by far more, see below), so the
    // logits are checked to 5e-3, on several blocks.
    for seed in 21..25 {
        let ps = block_params(&mut Rng::new(seed));
        let logits = |g: &mut Graph, p: &[TensorId]| block_to(g, p, false);
        let opts = Opts {
            tol: 5e-3,
            ..Opts::default()
        };
        assert_grads_with("llama block (logits)", &ps, &logits, &opts);
        assert_grads_with("llama block (loss)", &ps, &block, &loss_opts());
    }
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
    let k = g.input("k", F32, &[2, 2, 1, 1]).unwrap();
    let cols = g.im2col(k, x, [1, 1], [0, 0], [1, 1]).unwrap();
    let l = g.sum(cols).unwrap();
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
