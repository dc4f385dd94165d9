//! What the CPU kernels need besides their outputs (scratch in the plan's arena), and
//! compiling a graph into a plan with those sizes.

use tinynn_core::graph::Graph;
use tinynn_core::ops::Op;
use tinynn_core::plan::Plan;
use tinynn_core::quant;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

/// A plan for `graph` with the CPU kernels' scratch.
pub fn compile(graph: Graph) -> Plan {
    Plan::compile_with(graph, &work_bytes)
}

/// Rows of a non-F32 weight a backend dequantizes at a time for `mul_mat_t` (sizes its work).
pub const MUL_MAT_T_PANEL_ROWS: usize = 4096;

/// Scratch bytes an op needs besides its output.
pub fn work_bytes(graph: &Graph, node: TensorId) -> usize {
    let n = graph.node(node);
    match n.op {
        Op::MulMat | Op::MulMatId => {
            let (a, b) = (graph.layout(n.src[0]), graph.layout(n.src[1]));
            // The backends' packed kernels take Q8_1-sized activation blocks for the Q8_0-dot
            // formats (the exact Σq in the extra slot) and f32 (values rounded to f16) for F16;
            // the others' (Q8_1, BF16) are their dot types.
            let dot = match a.dtype {
                GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => GgmlType::Q8_1,
                GgmlType::F16 => GgmlType::F32,
                t => quant::vec_dot_type(t).unwrap_or(t),
            };
            quant::row_bytes(dot, b.ne[0]).unwrap_or(0) * b.n_rows()
        }
        // A non-F32 weight's gradient product: a panel of dequantized rows and a partial
        // product, or with a transposed Q8_0 copy of the weight, dy's rows as Q8_1 blocks
        // (the CPU backend's `mul_mat_t`).
        Op::MulMatT => {
            let (w, dy, d) = (
                graph.layout(n.src[0]),
                graph.layout(n.src[1]),
                graph.layout(node),
            );
            if w.dtype == GgmlType::F32 {
                0
            } else {
                let panels = 4 * w.ne[0] * (w.ne[1].min(MUL_MAT_T_PANEL_ROWS) + d.ne[1]);
                let acts = quant::row_bytes(GgmlType::Q8_1, dy.ne[0]).unwrap_or(0) * dy.n_rows();
                panels.max(acts)
            }
        }
        // Query rows on the one-row path over an F16 cache that can reach the split view: a
        // partial per row, head and chunk (kernels::attention's split by kv rows).
        Op::FlashAttn { .. } => {
            let (q, k, v) = (
                graph.layout(n.src[0]),
                graph.layout(n.src[1]),
                graph.layout(n.src[2]),
            );
            if k.dtype == GgmlType::F16 && v.dtype == GgmlType::F16 {
                crate::kernels::attention::split_work_bytes(q.ne[1], q.ne[2], v.ne[0], k.ne[1])
            } else {
                0
            }
        }
        // Per-thread partial sums (loss, count) for up to 64 threads.
        Op::CrossEntropyLoss => 64 * 16,
        // Log-sum-exp and Σ dO·O per (head, query), f64.
        Op::FlashAttnBack { .. } => {
            let q = graph.layout(n.src[0]);
            16 * q.ne[1] * q.ne[2]
        }
        _ => 0,
    }
}
