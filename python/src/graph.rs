//! `tinynn.Graph`: the graph API with numpy in and out (define, compile once, then write /
//! compute / read). Tensors are ints (ids of the graph's tensors).

use std::sync::Mutex;

use numpy::{IntoPyArray, PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use tinynn::core::graph::{Graph as CoreGraph, GraphError};
use tinynn::core::ops::{Rope, RopeMode, Unary};
use tinynn::core::tensor::TensorId;
use tinynn::format::GgmlType;
use tinynn::graph_program::{GraphProgram, OptimizerKind, OptimizerSettings};

use crate::err;
use crate::model::Model;

/// A graph: build with the op methods (each returns the new tensor's id), `backward`,
/// `optimizer`; then `compile`, and `write` / `compute` / `read` as often as needed.
#[pyclass(module = "tinynn")]
pub struct Graph {
    program: Mutex<GraphProgram>,
}

fn t(id: u32) -> TensorId {
    TensorId(id)
}

impl Graph {
    fn build(
        &self,
        f: impl FnOnce(&mut CoreGraph) -> Result<TensorId, GraphError>,
    ) -> PyResult<u32> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        let g = p.graph().map_err(err)?;
        Ok(f(g).map_err(|e| PyValueError::new_err(e.to_string()))?.0)
    }
}

fn ggml_dims(dims: &[usize]) -> PyResult<Vec<usize>> {
    if dims.is_empty() || dims.len() > 4 || dims.contains(&0) {
        return Err(PyValueError::new_err(format!(
            "shape {dims:?}: 1 to 4 dimensions, each at least 1"
        )));
    }
    // numpy order (outermost first) → ggml order (innermost first).
    Ok(dims.iter().rev().copied().collect())
}

fn ggml_dtype(name: &str) -> PyResult<GgmlType> {
    match name {
        "f32" | "float32" => Ok(GgmlType::F32),
        "i32" | "int32" => Ok(GgmlType::I32),
        other => GgmlType::from_name(other)
            .ok_or_else(|| PyValueError::new_err(format!("dtype '{other}' is not known"))),
    }
}

#[pymethods]
impl Graph {
    #[new]
    fn new() -> Graph {
        Graph {
            program: Mutex::new(GraphProgram::new()),
        }
    }

    /// An input of numpy shape `shape` ("f32" or "i32"; or a ggml type name such as "q8_0"),
    /// written before each compute.
    #[pyo3(signature = (name, shape, dtype="f32"))]
    fn input(&self, name: &str, shape: Vec<usize>, dtype: &str) -> PyResult<u32> {
        let (ne, ty) = (ggml_dims(&shape)?, ggml_dtype(dtype)?);
        self.build(|g| g.input(name, ty, &ne))
    }

    /// A trainable f32 parameter of numpy shape `shape` (zero until written).
    fn param(&self, name: &str, shape: Vec<usize>) -> PyResult<u32> {
        let ne = ggml_dims(&shape)?;
        self.build(|g| g.persistent(name, GgmlType::F32, &ne))
    }

    /// The model's tensor `name` (GGUF name, any type) as a read-only leaf.
    fn model_tensor(&self, model: PyRef<'_, Model>, name: &str) -> PyResult<u32> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        Ok(p.model_tensor(&model.model, name).map_err(err)?.0)
    }

    /// `x @ w.T` in numpy terms: w `[N, K]` (any type) times x `[M, K]` → `[M, N]` (ggml's
    /// `mul_mat`).
    fn matmul(&self, w: u32, x: u32) -> PyResult<u32> {
        self.build(|g| g.mul_mat(t(w), t(x)))
    }

    /// a + b (b broadcast).
    fn add(&self, a: u32, b: u32) -> PyResult<u32> {
        self.build(|g| g.add(t(a), t(b)))
    }

    /// a − b.
    fn sub(&self, a: u32, b: u32) -> PyResult<u32> {
        self.build(|g| g.sub(t(a), t(b)))
    }

    /// a · b (element-wise).
    fn mul(&self, a: u32, b: u32) -> PyResult<u32> {
        self.build(|g| g.mul(t(a), t(b)))
    }

    /// a / b.
    fn div(&self, a: u32, b: u32) -> PyResult<u32> {
        self.build(|g| g.div(t(a), t(b)))
    }

    /// s · a.
    fn scale(&self, a: u32, s: f32) -> PyResult<u32> {
        self.build(|g| g.scale(t(a), s))
    }

    /// An activation: "silu", "gelu", "gelu_erf", "tanh", "exp", "sqr", "sqrt" or "neg".
    fn act(&self, kind: &str, a: u32) -> PyResult<u32> {
        let u = match kind {
            "silu" => Unary::Silu,
            "gelu" => Unary::GeluTanh,
            "gelu_erf" => Unary::GeluErf,
            "tanh" => Unary::Tanh,
            "exp" => Unary::Exp,
            "sqr" => Unary::Sqr,
            "sqrt" => Unary::Sqrt,
            "neg" => Unary::Neg,
            other => {
                return Err(PyValueError::new_err(format!(
                    "activation '{other}' is not known"
                )))
            }
        };
        self.build(|g| g.unary(u, t(a)))
    }

    /// RMS normalization of each row (last numpy axis).
    #[pyo3(signature = (a, eps=1e-5))]
    fn rms_norm(&self, a: u32, eps: f32) -> PyResult<u32> {
        self.build(|g| g.rms_norm(t(a), eps))
    }

    /// Layer normalization of each row.
    #[pyo3(signature = (a, eps=1e-5))]
    fn layer_norm(&self, a: u32, eps: f32) -> PyResult<u32> {
        self.build(|g| g.layer_norm(t(a), eps, None, None))
    }

    /// Softmax of each row of `scale·a + mask`.
    #[pyo3(signature = (a, mask=None, scale=1.0))]
    fn softmax(&self, a: u32, mask: Option<u32>, scale: f32) -> PyResult<u32> {
        self.build(|g| g.soft_max(t(a), mask.map(t), scale))
    }

    /// RoPE on `a` (numpy `[n, heads, head_dim]`) at positions `pos` (i32 `[n]`).
    #[pyo3(signature = (a, pos, n_dims, neox=true, base=10000.0))]
    fn rope(&self, a: u32, pos: u32, n_dims: usize, neox: bool, base: f32) -> PyResult<u32> {
        let mode = if neox {
            RopeMode::Neox
        } else {
            RopeMode::Normal
        };
        self.build(|g| g.rope(t(a), t(pos), Rope::new(mode, n_dims, base)))
    }

    /// Attention: q numpy `[batch, heads, n_q, d]`, k / v `[batch, kv_heads, n_kv, d]`, an
    /// optional additive mask `[n_q, n_kv]` → `[batch, n_q, heads, d]`.
    #[pyo3(signature = (q, k, v, mask=None, scale=1.0))]
    fn attention(&self, q: u32, k: u32, v: u32, mask: Option<u32>, scale: f32) -> PyResult<u32> {
        self.build(|g| g.flash_attn(t(q), t(k), t(v), mask.map(t), None, scale, 0.0))
    }

    /// Rows `ids` (i32 `[n]`) of `table` (numpy `[R, K]`) → `[n, K]`.
    fn get_rows(&self, table: u32, ids: u32) -> PyResult<u32> {
        self.build(|g| g.get_rows(t(table), t(ids)))
    }

    /// `a` with numpy shape `shape` (same element count).
    fn reshape(&self, a: u32, shape: Vec<usize>) -> PyResult<u32> {
        let ne = ggml_dims(&shape)?;
        self.build(|g| g.reshape(t(a), &ne))
    }

    /// The last two numpy axes swapped (a view; `cont` makes it contiguous).
    fn transpose(&self, a: u32) -> PyResult<u32> {
        self.build(|g| g.transpose(t(a)))
    }

    /// ggml's permute (dimension i, innermost first, goes to position axes[i]).
    fn permute(&self, a: u32, axes: [usize; 4]) -> PyResult<u32> {
        self.build(|g| g.permute(t(a), axes))
    }

    /// A contiguous copy.
    fn cont(&self, a: u32) -> PyResult<u32> {
        self.build(|g| g.cont(t(a)))
    }

    /// `a` and `b` joined along numpy axis `axis` (counted from the end when negative).
    fn concat(&self, a: u32, b: u32, axis: i64) -> PyResult<u32> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        let g = p.graph().map_err(err)?;
        let rank = g
            .layout(t(a))
            .ne
            .iter()
            .rposition(|&d| d > 1)
            .map_or(1, |i| i + 1)
            .max(
                g.layout(t(b))
                    .ne
                    .iter()
                    .rposition(|&d| d > 1)
                    .map_or(1, |i| i + 1),
            ) as i64;
        let axis = if axis < 0 { rank + axis } else { axis };
        if !(0..rank).contains(&axis) {
            return Err(PyValueError::new_err(format!(
                "axis {axis} of a {rank}-d tensor"
            )));
        }
        let dim = (rank - 1 - axis) as usize;
        Ok(g.concat(t(a), t(b), dim)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .0)
    }

    /// The sum of every element (`[1]`).
    fn sum(&self, a: u32) -> PyResult<u32> {
        self.build(|g| g.sum(t(a)))
    }

    /// Each row's mean (last numpy axis → 1).
    fn mean(&self, a: u32) -> PyResult<u32> {
        self.build(|g| g.mean(t(a)))
    }

    /// Each row's sum.
    fn sum_rows(&self, a: u32) -> PyResult<u32> {
        self.build(|g| g.sum_rows(t(a)))
    }

    /// Mean cross-entropy of `logits` (numpy `[n, classes]`) against `labels` (i32 `[n]`;
    /// negative: not counted) → `[1]`.
    fn cross_entropy(&self, logits: u32, labels: u32) -> PyResult<u32> {
        self.build(|g| g.cross_entropy_loss(t(logits), t(labels)))
    }

    /// Keeps `a` readable after each compute.
    fn output(&self, a: u32) -> PyResult<()> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        p.graph()
            .map_err(err)?
            .set_output(t(a))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// The gradients of scalar `loss` for `params` (readable after a compute).
    fn backward(&self, loss: u32, params: Vec<u32>) -> PyResult<Vec<u32>> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        let g = p.graph().map_err(err)?;
        let ps: Vec<TensorId> = params.iter().map(|&x| t(x)).collect();
        let grads = g
            .backward(t(loss), &ps)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        for &gr in &grads {
            g.set_output(gr)
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        Ok(grads.iter().map(|x| x.0).collect())
    }

    /// Adds an in-place update of `params` by `grads` at each compute: "adamw" or "sgd".
    #[pyo3(signature = (kind, params, grads, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, momentum=0.9))]
    #[allow(clippy::too_many_arguments)]
    fn optimizer(
        &self,
        kind: &str,
        params: Vec<u32>,
        grads: Vec<u32>,
        lr: f32,
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
        momentum: f32,
    ) -> PyResult<()> {
        let kind = match kind {
            "adamw" => OptimizerKind::AdamW,
            "sgd" => OptimizerKind::Sgd,
            o => {
                return Err(PyValueError::new_err(format!(
                    "optimizer '{o}' is not 'adamw' or 'sgd'"
                )))
            }
        };
        let ps: Vec<TensorId> = params.iter().map(|&x| t(x)).collect();
        let gs: Vec<TensorId> = grads.iter().map(|&x| t(x)).collect();
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        p.optimizer(kind, &ps, &gs).map_err(err)?;
        self.set_lr_locked(
            &mut p,
            OptimizerSettings {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
                momentum,
            },
        )
    }

    /// Changes the optimizer's learning rate (its other settings stay).
    fn set_lr(&self, lr: f32) -> PyResult<()> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        let mut s = p.optimizer_settings().map_err(err)?;
        s.lr = lr;
        self.set_lr_locked(&mut p, s)
    }

    /// Compiles the graph (one plan, one arena) for `threads` threads.
    #[pyo3(signature = (threads=2))]
    fn compile(&self, py: Python<'_>, threads: usize) -> PyResult<()> {
        py.allow_threads(|| {
            let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
            p.compile(threads)
        })
        .map_err(err)
    }

    /// Writes a numpy array into input or parameter `a` (its shape and dtype must match).
    fn write(&self, a: u32, value: &Bound<'_, PyAny>) -> PyResult<()> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        let layout = p.layout(t(a)).map_err(err)?;
        let bytes: Vec<u8> = match layout.dtype {
            GgmlType::F32 => {
                let arr = value
                    .extract::<numpy::PyReadonlyArrayDyn<'_, f32>>()
                    .map_err(|_| {
                        PyValueError::new_err(format!("tensor {a} takes a float32 array"))
                    })?;
                check_shape(a, arr.shape(), &layout.ne)?;
                arr.as_array()
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect()
            }
            GgmlType::I32 => {
                let arr = value
                    .extract::<numpy::PyReadonlyArrayDyn<'_, i32>>()
                    .map_err(|_| {
                        PyValueError::new_err(format!("tensor {a} takes an int32 array"))
                    })?;
                check_shape(a, arr.shape(), &layout.ne)?;
                arr.as_array()
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect()
            }
            other => {
                let arr = value
                    .extract::<numpy::PyReadonlyArrayDyn<'_, u8>>()
                    .map_err(|_| {
                        PyValueError::new_err(format!(
                            "tensor {a} ({other}) takes its raw bytes as uint8"
                        ))
                    })?;
                arr.as_array().iter().copied().collect()
            }
        };
        p.write(t(a), &bytes).map_err(err)
    }

    /// Tensor `a` (an output, a gradient or a parameter) as a float32 numpy array.
    fn read<'py>(&self, py: Python<'py>, a: u32) -> PyResult<Bound<'py, PyArrayDyn<f32>>> {
        let mut p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        let layout = p.layout(t(a)).map_err(err)?;
        let v = p.read_f32(t(a)).map_err(err)?;
        let dims = numpy_shape(&layout.ne);
        v.into_pyarray(py).reshape(dims)
    }

    /// Tensor `a`'s numpy shape.
    fn shape(&self, a: u32) -> PyResult<Vec<usize>> {
        let p = self.program.lock().unwrap_or_else(|e| e.into_inner());
        Ok(numpy_shape(&p.layout(t(a)).map_err(err)?.ne))
    }

    /// Runs the graph once (with an optimizer: one training step), without the GIL.
    fn compute(&self, py: Python<'_>) -> PyResult<()> {
        py.allow_threads(|| self.program.lock().unwrap_or_else(|e| e.into_inner()).run())
            .map_err(err)
    }
}

impl Graph {
    fn set_lr_locked(&self, p: &mut GraphProgram, s: OptimizerSettings) -> PyResult<()> {
        p.set_optimizer(s)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}

/// ggml dims (innermost first, padded with 1s) as a numpy shape (outermost first), trailing
/// 1s dropped (at least one dimension).
fn numpy_shape(ne: &[usize; 4]) -> Vec<usize> {
    let rank = ne.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    ne[..rank].iter().rev().copied().collect()
}

fn check_shape(a: u32, got: &[usize], ne: &[usize; 4]) -> PyResult<()> {
    let n: usize = ne.iter().product();
    let m: usize = got.iter().product();
    if n != m {
        return Err(PyValueError::new_err(format!(
            "tensor {a} has shape {:?}, the array {got:?}",
            numpy_shape(ne)
        )));
    }
    Ok(())
}
