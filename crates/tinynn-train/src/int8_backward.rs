//! Which frozen weights get the backend's int8 gradient product (`Backend::pack_backward`,
//! `TrainConfig::int8_backward`).
//!
//! Every gradient product `Wᵀ·dy` of a frozen weight takes it, except those whose `dy` is the
//! loss's gradient over the vocabulary (the output head's): softmax − one-hot has one entry
//! near −1 among tiny ones, and 8 bits per 32 values flush the tiny ones to zero — the
//! push-down on every wrong token. Measured on SmolLM2 Q4_1 QLoRA (r8 q,v, 40 steps of
//! 256 × 4 tokens): the head's product in int8 left the loss 0.07 above the f32 run's
//! (3.228 vs 3.160, eval 3.058 vs 3.020); the layers' products alone in int8 ended at 3.160
//! (eval 3.013).

use tinynn_core::graph::Graph;
use tinynn_core::ops::Op;
use tinynn_core::tensor::TensorId;

/// Nodes [`from_loss`] looks at before it gives up (a head's `dy` is a few views and
/// element-wise steps from the loss's gradient).
const SEARCH_NODES: usize = 64;

/// Whether frozen weight `w` of `graph` should get the int8 gradient product: some
/// `mul_mat_t` reads it, and none of them with the loss's gradient as `dy`.
pub(crate) fn wants_int8_backward(graph: &Graph, w: TensorId) -> bool {
    let w = graph.root(w).0;
    let mut read = false;
    for n in graph.nodes() {
        if n.op != Op::MulMatT || graph.root(n.src[0]).0 != w {
            continue;
        }
        if from_loss(graph, n.src[1]) {
            return false;
        }
        read = true;
    }
    read
}

/// Whether `t` is computed from the cross-entropy loss's gradient through steps other than
/// matrix products (which start a layer's own gradients).
fn from_loss(graph: &Graph, t: TensorId) -> bool {
    let mut stack = vec![t];
    let mut seen = 0;
    while let Some(t) = stack.pop() {
        seen += 1;
        if seen > SEARCH_NODES {
            break;
        }
        let n = graph.node(t);
        match n.op {
            Op::CrossEntropyLossBack => return true,
            Op::MulMat | Op::MulMatT | Op::MulMatId | Op::OutProd => {}
            _ => stack.extend(n.src.iter().copied()),
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinynn_format::GgmlType;

    /// x → layer (frozen `w`) → silu → head (frozen `head`) → cross-entropy; `unused` is
    /// read only by a row lookup.
    #[test]
    fn every_gradient_product_but_the_heads_gets_int8() {
        let mut g = Graph::new();
        let w = g.persistent("w", GgmlType::Q4_1, &[32, 64]).unwrap();
        let head = g.persistent("head", GgmlType::Q8_0, &[64, 96]).unwrap();
        let unused = g.persistent("emb", GgmlType::Q8_0, &[32, 96]).unwrap();
        let ids = g.input("ids", GgmlType::I32, &[4]).unwrap();
        let x = g.get_rows(unused, ids).unwrap(); // [32, 4]
        let x = g.cont(x).unwrap();
        let h = g.mul_mat(w, x).unwrap(); // [64, 4]
        let h = g.silu(h).unwrap();
        let logits = g.mul_mat(head, h).unwrap(); // [96, 4]
        let labels = g.input("labels", GgmlType::I32, &[4]).unwrap();
        let loss = g.cross_entropy_loss(logits, labels).unwrap();
        let grads = g.backward_to(loss, &[x], 1.0).unwrap();
        g.set_output(grads[0].unwrap()).unwrap();
        assert!(wants_int8_backward(&g, w));
        assert!(!wants_int8_backward(&g, head), "dy is the loss's gradient");
        assert!(
            !wants_int8_backward(&g, unused),
            "no gradient product reads it"
        );
    }
}
