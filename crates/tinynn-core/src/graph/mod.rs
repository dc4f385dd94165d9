//! Define-then-run graphs: tensors are nodes created by typed builder calls that check shapes
//! and types and return errors (never panic). A graph is compiled once into a
//! [`Plan`](crate::plan::Plan) and run many times.

mod backward;
mod backward_rules;
mod build;
mod build_attention;
mod build_back;
mod build_extra;
mod build_moe;
mod build_reduce;
mod build_train;
mod views;

pub use backward::{AdamState, Contributions, GradMode, Gradients, RuleOverride};
pub use build_attention::MAX_HEAD_DIM;

use tinynn_format::GgmlType;

use crate::ops::Op;
use crate::quant;
use crate::tensor::{Layout, TensorId, MAX_DIMS};

/// Where a tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mem {
    /// Planned into the plan's arena.
    Arena,
    /// Read-only memory bound at run time (model weights, usually an mmap).
    Weight,
    /// Read-write memory that outlives a run (inputs, KV cache, training state).
    Persistent,
    /// The memory of `base`, starting `offset` bytes in.
    Alias { base: TensorId, offset: usize },
}

/// One tensor of the graph and the op that produces it.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub layout: Layout,
    pub op: Op,
    pub src: Vec<TensorId>,
    pub mem: Mem,
}

/// A shape or type problem found while building a graph.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct GraphError {
    pub op: &'static str,
    pub message: String,
}

pub type Result<T> = std::result::Result<T, GraphError>;

pub(crate) fn err<T>(op: &'static str, message: impl Into<String>) -> Result<T> {
    Err(GraphError {
        op,
        message: message.into(),
    })
}

/// A graph under construction (and, once built, the input of the planner).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    nodes: Vec<Node>,
    outputs: Vec<TensorId>,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, t: TensorId) -> &Node {
        &self.nodes[t.index()]
    }

    pub fn layout(&self, t: TensorId) -> &Layout {
        &self.nodes[t.index()].layout
    }

    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Keeps `t` alive to the end of a run so its value can be read afterwards.
    pub fn set_output(&mut self, t: TensorId) -> Result<()> {
        self.check_id("set_output", t)?;
        if !self.outputs.contains(&t) {
            self.outputs.push(t);
        }
        Ok(())
    }

    /// Follows aliases to the tensor that owns the memory, and the byte offset into it.
    pub fn root(&self, t: TensorId) -> (TensorId, usize) {
        let (mut t, mut offset) = (t, 0);
        while let Mem::Alias { base, offset: o } = self.nodes[t.index()].mem {
            offset += o;
            t = base;
        }
        (t, offset)
    }

    /// Names a tensor (for plans, traces and errors).
    pub fn set_name(&mut self, t: TensorId, name: impl Into<String>) -> Result<()> {
        self.check_id("set_name", t)?;
        self.nodes[t.index()].name = name.into();
        Ok(())
    }

    fn check_id(&self, op: &'static str, t: TensorId) -> Result<()> {
        if t.index() < self.nodes.len() {
            Ok(())
        } else {
            err(op, format!("tensor #{} is not in this graph", t.0))
        }
    }

    fn push(
        &mut self,
        name: String,
        layout: Layout,
        op: Op,
        src: Vec<TensorId>,
        mem: Mem,
    ) -> TensorId {
        let id = TensorId(self.nodes.len() as u32);
        self.nodes.push(Node {
            name,
            layout,
            op,
            src,
            mem,
        });
        id
    }

    fn leaf(
        &mut self,
        op: &'static str,
        name: &str,
        dtype: GgmlType,
        ne: &[usize],
        mem: Mem,
    ) -> Result<TensorId> {
        let ne = full_shape(op, ne)?;
        if quant::row_bytes(dtype, ne[0]).is_err() && !matches!(dtype, GgmlType::I32) {
            return err(
                op,
                format!(
                    "'{name}': {dtype} rows of {} elements are not supported",
                    ne[0]
                ),
            );
        }
        Ok(self.push(
            name.to_string(),
            Layout::contiguous(dtype, ne),
            Op::Leaf,
            Vec::new(),
            mem,
        ))
    }

    /// A read-only tensor bound at run time (a model weight), contiguous, shape `ne` (innermost first).
    pub fn weight(&mut self, name: &str, dtype: GgmlType, ne: &[usize]) -> Result<TensorId> {
        self.leaf("weight", name, dtype, ne, Mem::Weight)
    }

    /// A read-write tensor that keeps its value between runs (inputs, KV cache). Zero at first.
    pub fn persistent(&mut self, name: &str, dtype: GgmlType, ne: &[usize]) -> Result<TensorId> {
        self.leaf("persistent", name, dtype, ne, Mem::Persistent)
    }

    /// A run-time input: a persistent tensor the caller writes before each run.
    pub fn input(&mut self, name: &str, dtype: GgmlType, ne: &[usize]) -> Result<TensorId> {
        self.persistent(name, dtype, ne)
    }

    /// A tensor computed by `op` into the arena.
    fn computed(&mut self, op: Op, layout: Layout, src: Vec<TensorId>) -> TensorId {
        let name = format!("{}#{}", op.name(), self.nodes.len());
        self.push(name, layout, op, src, Mem::Arena)
    }
}

/// Pads a shape of 1 to 4 dimensions with 1s; every dimension must be at least 1.
pub(crate) fn full_shape(op: &'static str, ne: &[usize]) -> Result<[usize; MAX_DIMS]> {
    if ne.is_empty() || ne.len() > MAX_DIMS {
        return err(
            op,
            format!("shape {ne:?} must have 1 to {MAX_DIMS} dimensions"),
        );
    }
    if ne.contains(&0) {
        return err(op, format!("shape {ne:?} has a zero dimension"));
    }
    let mut out = [1; MAX_DIMS];
    out[..ne.len()].copy_from_slice(ne);
    if out
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .is_none()
    {
        return err(op, format!("shape {ne:?} has too many elements"));
    }
    Ok(out)
}
