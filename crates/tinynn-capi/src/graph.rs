//! The graph API (define, then run), what a host framework builds its layers on: a graph of
//! inputs, trainable parameters and a model's tensors, the op set, backward, an optimizer
//! step, then `tnn_graph_compile` (one plan, one arena) and any number of
//! `tnn_graph_compute`s with tensor data written and read in between. Tensors are `TnnTensor`
//! ids of their graph. A graph handle serves one call at a time.

use std::ffi::c_char;
use std::sync::Mutex;

use tinynn::core::graph::Graph;
use tinynn::core::ops::{Rope, RopeMode, Unary};
use tinynn::core::tensor::{TensorId, MAX_DIMS};
use tinynn::format::ggml_type::TypeId;
use tinynn::format::GgmlType;
use tinynn::graph_program::{GraphProgram, OptimizerKind, OptimizerSettings, ProgramError};

use crate::args::{copy_out, put, slice_arg, str_arg};
use crate::handles::{free, get, register};
use crate::model::{model_of, TnnModel};
use crate::status::{guard, Failure, Outcome, TnnStatus};

/// A graph. One call at a time.
pub struct TnnGraph {
    _private: [u8; 0],
}

/// A tensor of a graph (its id).
pub type TnnTensor = u32;

/// "No tensor", for optional operands (a mask).
pub const TNN_NONE: TnnTensor = u32::MAX;

struct GraphState {
    program: GraphProgram,
}

type GraphObject = Mutex<GraphState>;

fn with_graph<T>(
    handle: *const TnnGraph,
    f: impl FnOnce(&mut GraphState) -> Outcome<T>,
) -> Outcome<T> {
    let g = get::<GraphObject, TnnGraph>(handle, "graph")?;
    let mut guard = g.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard)
}

fn graph_err(e: tinynn::core::graph::GraphError) -> Failure {
    Failure::invalid(e.to_string())
}

fn program_err(e: ProgramError) -> Failure {
    match e {
        ProgramError::Model(m) => m.into(),
        ProgramError::Backend(m) => Failure::new(TnnStatus::TNN_ERR_MODEL, m),
        other => Failure::invalid(other.to_string()),
    }
}

/// A graph error of `op` (for arguments refused before the builder sees them).
fn gerr(op: &'static str, message: impl Into<String>) -> tinynn::core::graph::GraphError {
    tinynn::core::graph::GraphError {
        op,
        message: message.into(),
    }
}

/// Builds on the graph (before compiling) and writes the new tensor's id to `out`.
fn build(
    handle: *const TnnGraph,
    out: *mut TnnTensor,
    f: impl FnOnce(&mut Graph) -> Result<TensorId, tinynn::core::graph::GraphError>,
) -> TnnStatus {
    guard(|| {
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        with_graph(handle, |st| {
            let g = st.program.graph().map_err(program_err)?;
            let t = f(g).map_err(graph_err)?;
            put(out, t.0, "out")
        })
    })
}

fn tid(t: TnnTensor) -> TensorId {
    TensorId(t)
}

fn dims(ne: *const i64, n: usize) -> Outcome<Vec<usize>> {
    if n == 0 || n > MAX_DIMS {
        return Err(Failure::invalid(format!(
            "{n} dimensions (1 to {MAX_DIMS})"
        )));
    }
    slice_arg(ne, n, "ne")?
        .iter()
        .map(|&d| {
            usize::try_from(d)
                .ok()
                .filter(|d| (1..=1 << 40).contains(d))
                .ok_or_else(|| Failure::invalid(format!("dimension {d} must be 1 to 2^40")))
        })
        .collect()
}

fn ggml_type(t: u32) -> Outcome<GgmlType> {
    match GgmlType::from_id(t) {
        TypeId::Known(t) => Ok(t),
        _ => Err(Failure::invalid(format!("ggml type {t} is not known"))),
    }
}

/// Makes an empty graph into `*out`.
///
/// # Safety
/// `out` is a writable `TnnGraph*`.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_new(out: *mut *mut TnnGraph) -> TnnStatus {
    guard(|| {
        let st: GraphObject = Mutex::new(GraphState {
            program: GraphProgram::new(),
        });
        put(out, register(st), "out")
    })
}

/// Frees a graph handle (null: nothing).
///
/// # Safety
/// `graph` is null or a handle from `tnn_graph_new`.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_free(graph: *mut TnnGraph) -> TnnStatus {
    guard(|| free::<GraphObject, TnnGraph>(graph, "graph"))
}

/// An input of ggml type `type` (0 F32, 1 F16, 26 I32, 8 Q8_0, ... as ggml numbers them) and
/// dims `ne` (`n_dims` of them, innermost first), written before each compute.
///
/// # Safety
/// `name` is NUL-terminated; `ne` holds `n_dims` values; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_input(
    graph: *mut TnnGraph,
    name: *const c_char,
    ggml_type_id: u32,
    ne: *const i64,
    n_dims: usize,
    out: *mut TnnTensor,
) -> TnnStatus {
    let args: Outcome<(String, GgmlType, Vec<usize>)> = (|| {
        Ok((
            str_arg(name, "name")?.to_string(),
            ggml_type(ggml_type_id)?,
            dims(ne, n_dims)?,
        ))
    })();
    build(graph, out, |g| match &args {
        Ok((name, ty, ne)) => g.input(name, *ty, ne),
        Err(e) => Err(gerr("input", e_msg(e))),
    })
}

/// A trainable F32 parameter of dims `ne`: it keeps its value between computes (zero until
/// written with `tnn_tensor_write`), and `tnn_graph_optimizer` updates it.
///
/// # Safety
/// As `tnn_graph_input`.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_param(
    graph: *mut TnnGraph,
    name: *const c_char,
    ne: *const i64,
    n_dims: usize,
    out: *mut TnnTensor,
) -> TnnStatus {
    let args: Outcome<(String, Vec<usize>)> =
        (|| Ok((str_arg(name, "name")?.to_string(), dims(ne, n_dims)?)))();
    build(graph, out, |g| match &args {
        Ok((name, ne)) => g.persistent(name, GgmlType::F32, ne),
        Err(e) => Err(gerr("param", e_msg(e))),
    })
}

fn e_msg(e: &Failure) -> String {
    e.message.clone()
}

/// The model's tensor `name` (GGUF name, any type, read-only) as a leaf of the graph; the
/// graph keeps the model alive.
///
/// # Safety
/// `name` is NUL-terminated; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_model_tensor(
    graph: *mut TnnGraph,
    model: *const TnnModel,
    name: *const c_char,
    out: *mut TnnTensor,
) -> TnnStatus {
    guard(|| {
        let m = model_of(model)?;
        let name = str_arg(name, "name")?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        with_graph(graph, |st| {
            let t = st
                .program
                .model_tensor(&m.model, name)
                .map_err(program_err)?;
            put(out, t.0, "out")
        })
    })
}

/// `W·x`: W `[K, N, ...]` (any type) times x `[K, M, ...]` (F32) → `[N, M, ...]`.
#[no_mangle]
pub extern "C" fn tnn_op_mul_mat(
    graph: *mut TnnGraph,
    w: TnnTensor,
    x: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.mul_mat(tid(w), tid(x)))
}

/// Element-wise `a op b` (b broadcast over a): `op` 0 add, 1 sub, 2 mul, 3 div.
#[no_mangle]
pub extern "C" fn tnn_op_binary(
    graph: *mut TnnGraph,
    op: u32,
    a: TnnTensor,
    b: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| match op {
        0 => g.add(tid(a), tid(b)),
        1 => g.sub(tid(a), tid(b)),
        2 => g.mul(tid(a), tid(b)),
        3 => g.div(tid(a), tid(b)),
        _ => Err(gerr("binary", format!("op {op} is not 0-3"))),
    })
}

/// An activation: `op` 0 SiLU, 1 GELU (tanh), 2 GELU (erf), 3 tanh, 4 exp, 5 square,
/// 6 square root, 7 negation.
#[no_mangle]
pub extern "C" fn tnn_op_unary(
    graph: *mut TnnGraph,
    op: u32,
    a: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    let u = match op {
        0 => Some(Unary::Silu),
        1 => Some(Unary::GeluTanh),
        2 => Some(Unary::GeluErf),
        3 => Some(Unary::Tanh),
        4 => Some(Unary::Exp),
        5 => Some(Unary::Sqr),
        6 => Some(Unary::Sqrt),
        7 => Some(Unary::Neg),
        _ => None,
    };
    build(graph, out, |g| match u {
        Some(u) => g.unary(u, tid(a)),
        None => Err(gerr("unary", format!("op {op} is not 0-7"))),
    })
}

/// `s·a`.
#[no_mangle]
pub extern "C" fn tnn_op_scale(
    graph: *mut TnnGraph,
    a: TnnTensor,
    s: f32,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.scale(tid(a), s))
}

/// RMS normalization of each row (no weight: multiply by one).
#[no_mangle]
pub extern "C" fn tnn_op_rms_norm(
    graph: *mut TnnGraph,
    a: TnnTensor,
    eps: f32,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.rms_norm(tid(a), eps))
}

/// Layer normalization of each row (no weight or bias).
#[no_mangle]
pub extern "C" fn tnn_op_layer_norm(
    graph: *mut TnnGraph,
    a: TnnTensor,
    eps: f32,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.layer_norm(tid(a), eps, None, None))
}

/// Softmax of each row of `scale·a + mask` (`mask` may be `TNN_NONE`).
#[no_mangle]
pub extern "C" fn tnn_op_softmax(
    graph: *mut TnnGraph,
    a: TnnTensor,
    mask: TnnTensor,
    scale: f32,
    out: *mut TnnTensor,
) -> TnnStatus {
    let mask = (mask != TNN_NONE).then(|| tid(mask));
    build(graph, out, |g| g.soft_max(tid(a), mask, scale))
}

/// RoPE on the first `n_dims` of each head of `a` `[head_dim, heads, n]` at positions `pos`
/// (I32 `[n]`): `neox` rotates halves, else adjacent pairs; `base` is the frequency base.
#[no_mangle]
pub extern "C" fn tnn_op_rope(
    graph: *mut TnnGraph,
    a: TnnTensor,
    pos: TnnTensor,
    n_dims: u32,
    neox: bool,
    base: f32,
    out: *mut TnnTensor,
) -> TnnStatus {
    let mode = if neox {
        RopeMode::Neox
    } else {
        RopeMode::Normal
    };
    build(graph, out, |g| {
        g.rope(tid(a), tid(pos), Rope::new(mode, n_dims as usize, base))
    })
}

/// Attention: q `[d, n_q, heads, batch]`, k and v `[d, n_kv, kv_heads, batch]` →
/// `[d, heads, n_q, batch]`, scores `scale·q·k` plus `mask` (F32 `[n_kv, n_q]`, `TNN_NONE`:
/// none), softmax, times v.
#[no_mangle]
pub extern "C" fn tnn_op_attention(
    graph: *mut TnnGraph,
    q: TnnTensor,
    k: TnnTensor,
    v: TnnTensor,
    mask: TnnTensor,
    scale: f32,
    out: *mut TnnTensor,
) -> TnnStatus {
    let mask = (mask != TNN_NONE).then(|| tid(mask));
    build(graph, out, |g| {
        g.flash_attn(tid(q), tid(k), tid(v), mask, None, scale, 0.0)
    })
}

/// Rows `ids` (I32 `[n]`) of `table` `[K, R]` → F32 `[K, n]`.
#[no_mangle]
pub extern "C" fn tnn_op_get_rows(
    graph: *mut TnnGraph,
    table: TnnTensor,
    ids: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.get_rows(tid(table), tid(ids)))
}

/// `a` seen with dims `ne` (`n_dims` of them; the same element count; contiguous `a`).
///
/// # Safety
/// `ne` holds `n_dims` values.
#[no_mangle]
pub unsafe extern "C" fn tnn_op_reshape(
    graph: *mut TnnGraph,
    a: TnnTensor,
    ne: *const i64,
    n_dims: usize,
    out: *mut TnnTensor,
) -> TnnStatus {
    let ne = dims(ne, n_dims);
    build(graph, out, |g| match &ne {
        Ok(ne) => g.reshape(tid(a), ne),
        Err(e) => Err(gerr("reshape", e_msg(e))),
    })
}

/// `a` with its dimensions permuted: dimension i goes to position `axes[i]` (a view).
///
/// # Safety
/// `axes` holds 4 values.
#[no_mangle]
pub unsafe extern "C" fn tnn_op_permute(
    graph: *mut TnnGraph,
    a: TnnTensor,
    axes: *const u32,
    out: *mut TnnTensor,
) -> TnnStatus {
    let axes = slice_arg(axes, MAX_DIMS, "axes").map(|s| {
        let mut x = [0usize; MAX_DIMS];
        for (d, &v) in x.iter_mut().zip(s) {
            *d = v as usize;
        }
        x
    });
    build(graph, out, |g| match &axes {
        Ok(axes) => g.permute(tid(a), *axes),
        Err(e) => Err(gerr("permute", e_msg(e))),
    })
}

/// The first two dimensions of `a` swapped (a view).
#[no_mangle]
pub extern "C" fn tnn_op_transpose(
    graph: *mut TnnGraph,
    a: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.transpose(tid(a)))
}

/// A view of `a`: dims `ne` (`n_dims`), byte strides `nb` of dimensions 1.. (`n_dims − 1`
/// values), from byte `offset`.
///
/// # Safety
/// `ne` holds `n_dims` values and `nb` `n_dims − 1`.
#[no_mangle]
pub unsafe extern "C" fn tnn_op_view(
    graph: *mut TnnGraph,
    a: TnnTensor,
    ne: *const i64,
    n_dims: usize,
    nb: *const u64,
    offset: u64,
    out: *mut TnnTensor,
) -> TnnStatus {
    let ne = dims(ne, n_dims);
    let nb = slice_arg(nb, n_dims.saturating_sub(1), "nb")
        .map(|s| s.iter().map(|&v| v as usize).collect::<Vec<_>>());
    build(graph, out, |g| match (&ne, &nb) {
        (Ok(ne), Ok(nb)) => g.view(tid(a), ne, nb, offset as usize),
        (Err(e), _) | (_, Err(e)) => Err(gerr("view", e_msg(e))),
    })
}

/// A contiguous copy of `a`.
#[no_mangle]
pub extern "C" fn tnn_op_cont(
    graph: *mut TnnGraph,
    a: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.cont(tid(a)))
}

/// `a` and `b` joined along dimension `dim`.
#[no_mangle]
pub extern "C" fn tnn_op_concat(
    graph: *mut TnnGraph,
    a: TnnTensor,
    b: TnnTensor,
    dim: u32,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| g.concat(tid(a), tid(b), dim as usize))
}

/// A reduction: `op` 0 the sum of every element (`[1]`), 1 each row's mean, 2 each row's
/// sum (both `[1, rows...]`).
#[no_mangle]
pub extern "C" fn tnn_op_reduce(
    graph: *mut TnnGraph,
    op: u32,
    a: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| match op {
        0 => g.sum(tid(a)),
        1 => g.mean(tid(a)),
        2 => g.sum_rows(tid(a)),
        _ => Err(gerr("reduce", format!("op {op} is not 0-2"))),
    })
}

/// The mean cross-entropy of `logits` `[n_classes, n]` against `labels` (I32 `[n]`; a
/// negative label is not counted) → `[1]`.
#[no_mangle]
pub extern "C" fn tnn_op_cross_entropy(
    graph: *mut TnnGraph,
    logits: TnnTensor,
    labels: TnnTensor,
    out: *mut TnnTensor,
) -> TnnStatus {
    build(graph, out, |g| {
        g.cross_entropy_loss(tid(logits), tid(labels))
    })
}

/// Keeps `t` readable after each compute (`tnn_tensor_read`); parameters always are.
#[no_mangle]
pub extern "C" fn tnn_graph_output(graph: *mut TnnGraph, t: TnnTensor) -> TnnStatus {
    guard(|| {
        with_graph(graph, |st| {
            let g = st.program.graph().map_err(program_err)?;
            g.set_output(tid(t)).map_err(graph_err)
        })
    })
}

/// Appends the gradients of scalar `loss` with respect to `n` parameters; `grads[i]` gets the
/// gradient of `params[i]` (readable after a compute).
///
/// # Safety
/// `params` holds `n` values and `grads` has room for `n`.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_backward(
    graph: *mut TnnGraph,
    loss: TnnTensor,
    params: *const TnnTensor,
    n: usize,
    grads: *mut TnnTensor,
) -> TnnStatus {
    guard(|| {
        let params: Vec<TensorId> = slice_arg(params, n, "params")?
            .iter()
            .map(|&p| tid(p))
            .collect();
        if n > 0 && grads.is_null() {
            return Err(Failure::null("grads"));
        }
        with_graph(graph, |st| {
            let g = st.program.graph().map_err(program_err)?;
            let gs = g.backward(tid(loss), &params).map_err(graph_err)?;
            for (i, t) in gs.iter().enumerate() {
                g.set_output(*t).map_err(graph_err)?;
                // SAFETY: `grads` has room for `n` values (the API's contract).
                unsafe { grads.add(i).write(t.0) };
            }
            Ok(())
        })
    })
}

/// Adds an optimizer step to the graph: each compute then updates the `n` parameters in
/// place by their gradients — `kind` 0: AdamW (moments kept between computes), 1: SGD with
/// momentum. Its settings are `tnn_graph_set_optimizer`'s (default lr 1e-3, betas 0.9 /
/// 0.999, eps 1e-8, weight decay 0, momentum 0.9).
///
/// # Safety
/// `params` and `grads` hold `n` values.
#[no_mangle]
pub unsafe extern "C" fn tnn_graph_optimizer(
    graph: *mut TnnGraph,
    kind: u32,
    params: *const TnnTensor,
    grads: *const TnnTensor,
    n: usize,
) -> TnnStatus {
    guard(|| {
        let params = slice_arg(params, n, "params")?;
        let grads = slice_arg(grads, n, "grads")?;
        if kind > 1 {
            return Err(Failure::invalid(format!(
                "optimizer {kind} is not 0 (AdamW) or 1 (SGD)"
            )));
        }
        let kind = if kind == 0 {
            OptimizerKind::AdamW
        } else {
            OptimizerKind::Sgd
        };
        let params: Vec<TensorId> = params.iter().map(|&p| tid(p)).collect();
        let grads: Vec<TensorId> = grads.iter().map(|&p| tid(p)).collect();
        with_graph(graph, |st| {
            st.program
                .optimizer(kind, &params, &grads)
                .map_err(program_err)
        })
    })
}

/// The optimizer's settings for the next computes.
#[no_mangle]
pub extern "C" fn tnn_graph_set_optimizer(
    graph: *mut TnnGraph,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    momentum: f32,
) -> TnnStatus {
    guard(|| {
        let settings = OptimizerSettings {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
            momentum,
        };
        with_graph(graph, |st| {
            st.program.set_optimizer(settings).map_err(program_err)
        })
    })
}

/// Compiles the graph (one plan and one arena, `n_threads` threads). Afterwards no tensor can
/// be added; parameters are zero and inputs unset until written.
#[no_mangle]
pub extern "C" fn tnn_graph_compile(graph: *mut TnnGraph, n_threads: u32) -> TnnStatus {
    guard(|| {
        with_graph(graph, |st| {
            st.program.compile(n_threads as usize).map_err(program_err)
        })
    })
}

/// Writes `bytes` bytes of `data` into input or parameter `t` (its whole size, in its type).
///
/// # Safety
/// `data` holds `bytes` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn tnn_tensor_write(
    graph: *mut TnnGraph,
    t: TnnTensor,
    data: *const u8,
    bytes: usize,
) -> TnnStatus {
    guard(|| {
        let data = slice_arg(data, bytes, "data")?;
        with_graph(graph, |st| {
            st.program.write(tid(t), data).map_err(program_err)
        })
    })
}

/// Reads F32 tensor `t` (an output, a gradient or a parameter) into `out` (room for `cap`
/// floats); `*n` gets its element count.
///
/// # Safety
/// `out` has room for `cap` floats; `n` writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_tensor_read(
    graph: *mut TnnGraph,
    t: TnnTensor,
    out: *mut f32,
    cap: usize,
    n: *mut usize,
) -> TnnStatus {
    guard(|| {
        with_graph(graph, |st| {
            let v = st.program.read_f32(tid(t)).map_err(program_err)?;
            copy_out(&v, out, cap, n, "out")
        })
    })
}

/// The dims of tensor `t` (4 values, unused ones 1) and its ggml type.
///
/// # Safety
/// `ne` has room for 4 values; `ggml_type_id` writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_tensor_shape(
    graph: *mut TnnGraph,
    t: TnnTensor,
    ne: *mut i64,
    ggml_type_id: *mut u32,
) -> TnnStatus {
    guard(|| {
        with_graph(graph, |st| {
            let layout = st.program.layout(tid(t)).map_err(program_err)?;
            if ne.is_null() {
                return Err(Failure::null("ne"));
            }
            for (i, &d) in layout.ne.iter().enumerate() {
                // SAFETY: `ne` has room for 4 values (the API's contract).
                unsafe { ne.add(i).write(d as i64) };
            }
            if !ggml_type_id.is_null() {
                put(ggml_type_id, layout.dtype.id(), "ggml_type_id")?;
            }
            Ok(())
        })
    })
}

/// Runs the graph once (a training graph: one step, the optimizer's counter advancing).
#[no_mangle]
pub extern "C" fn tnn_graph_compute(graph: *mut TnnGraph) -> TnnStatus {
    guard(|| with_graph(graph, |st| st.program.run().map_err(program_err)))
}
