//! The boundary between graphs and the hardware that runs them. Models build graphs; a backend
//! plans them (its own scratch sizes), owns the memory of each plan (bound weights, persistent
//! tensors such as KV caches and parameters), prepares weights for its kernels (the CPU repacks
//! them), runs plans and reads results. Sessions and the trainer talk to this trait only; the
//! CPU backend is `tinynn_cpu::Executor`, and another backend is a new crate that implements it.

use std::ops::Range;
use std::sync::Arc;

use tinynn_format::GgmlType;

use crate::graph::Graph;
use crate::plan::Plan;
use crate::tensor::TensorId;

/// Bytes a plan's memory can hold on to without borrowing them: e.g. a model's memory-mapped
/// files behind an `Arc`, so a session can own its model instead of borrowing it.
pub trait WeightStore: Send + Sync {
    /// Region `i` of the store (one mapped file); the same bytes for the store's whole life.
    /// An index out of range gives no bytes.
    fn region(&self, i: usize) -> &[u8];
}

/// Where a weight's bytes are: a region of a store and a byte range in it.
#[derive(Clone)]
pub struct WeightRef {
    pub store: Arc<dyn WeightStore>,
    pub region: usize,
    pub range: Range<usize>,
}

impl WeightRef {
    /// The weight's bytes (empty when the range lies outside the region).
    pub fn bytes(&self) -> &[u8] {
        self.store
            .region(self.region)
            .get(self.range.clone())
            .unwrap_or_default()
    }
}

/// What [`Backend::run_observed`] calls with each watched tensor once it is final: the
/// tensor and its bytes.
pub type Ready<'a> = dyn Fn(TensorId, &[u8]) + Sync + 'a;

pub trait Backend: Send {
    /// Weights bound for, and persistent tensors owned on behalf of, one plan.
    type Memory: Send;
    /// A weight prepared for the backend's matrix kernels (shareable between plans and
    /// sessions).
    type Packed: Send + Sync + 'static;
    type Error: std::error::Error + Send + Sync + 'static;

    fn name(&self) -> &'static str;

    /// Compiles `graph` into a plan, with the scratch this backend's kernels need.
    fn compile(&self, graph: Graph) -> Plan;

    /// Memory for `plan`: weights unbound, persistent tensors zero, except those in `shared`,
    /// which get no storage of their own: another memory lends them ([`Backend::swap`]). An
    /// error when the device refuses the memory.
    fn new_memory(&self, plan: &Plan, shared: &[TensorId]) -> Result<Self::Memory, Self::Error>;

    /// Binds weight `t` to bytes the memory keeps alive through their store.
    fn bind_weight(
        &self,
        mem: &mut Self::Memory,
        plan: &Plan,
        t: TensorId,
        weight: WeightRef,
    ) -> Result<(), Self::Error>;

    /// A copy of a matrix weight (`dtype`, ggml dims `ne`, its bytes) laid out for the
    /// backend's kernels, or `None` when the backend uses the bytes as they are.
    fn pack(&self, dtype: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<Self::Packed>;

    /// Adds to `packed`, the copy of a frozen weight of a training graph, what makes its
    /// gradient product `Wᵀ·dy` (`mul_mat_t`) faster than reading the weight itself, at some
    /// cost in precision (the CPU backend: `Wᵀ` requantized to Q8_0 for its integer kernels,
    /// `dy` quantized as activations). False when the backend adds nothing; the product then
    /// reads the weight as before.
    fn pack_backward(&self, packed: &mut Self::Packed) -> bool {
        let _ = packed;
        false
    }

    /// Bytes a packed copy takes.
    fn packed_bytes(packed: &Self::Packed) -> usize;

    /// Lets the products that read `t` use `packed` (made by [`Backend::pack`] from its bytes)
    /// instead. `t` is a weight, or a persistent tensor no step of the plan writes (a frozen
    /// base in training); if its bytes change, the packed copy must be bound anew.
    fn bind_packed(
        &self,
        mem: &mut Self::Memory,
        plan: &Plan,
        t: TensorId,
        packed: Arc<Self::Packed>,
    ) -> Result<(), Self::Error>;

    /// Writes `bytes` into persistent tensor `t` from byte `offset` on (inputs before a run).
    fn write(
        &self,
        mem: &mut Self::Memory,
        plan: &Plan,
        t: TensorId,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), Self::Error>;

    /// Exchanges persistent tensor `t` of `mem` with `other_t` of `other` (a KV cache or the
    /// parameters moving to the plan that runs next); nothing is copied.
    #[allow(clippy::too_many_arguments)]
    fn swap(
        &self,
        mem: &mut Self::Memory,
        plan: &Plan,
        t: TensorId,
        other: &mut Self::Memory,
        other_plan: &Plan,
        other_t: TensorId,
    ) -> Result<(), Self::Error>;

    /// Bytes of persistent tensor `t` that `mem` holds: its size, or 0 when the tensor is lent
    /// to another memory ([`Backend::swap`]), has been released for its packed copy
    /// ([`Backend::release_source`]) or is not a persistent tensor of `plan`. For memory
    /// accounting.
    fn persistent_len(&self, mem: &Self::Memory, plan: &Plan, t: TensorId) -> usize;

    /// The bytes of persistent tensor `t` as they are after the last run (parameters and
    /// optimizer state for checkpoints, exports and views), aligned for its element type;
    /// empty when `mem` holds none ([`Backend::persistent_len`]). The CPU lends its own bytes
    /// without copying; a backend whose memory is elsewhere may hand out a host copy it keeps
    /// (made on demand, e.g. in `mem`).
    fn persistent<'a>(
        &'a self,
        mem: &'a Self::Memory,
        plan: &Plan,
        t: TensorId,
    ) -> Result<&'a [u8], Self::Error>;

    /// Calls `fill` once with all the bytes of persistent tensor `t` (aligned for its element
    /// type) to write them in place: loading parameters straight from a file, with no staging
    /// copy on the CPU. A backend whose memory is elsewhere may pass a host buffer (holding
    /// the tensor's current bytes) and upload it afterwards.
    fn fill_persistent(
        &self,
        mem: &mut Self::Memory,
        plan: &Plan,
        t: TensorId,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), Self::Error>;

    /// Sets persistent tensor `t` to zeros, allocating nothing (gradient buffers between
    /// optimizer steps).
    fn zero(&self, mem: &mut Self::Memory, plan: &Plan, t: TensorId) -> Result<(), Self::Error>;

    /// Whether [`Backend::release_source`] would free `t`'s bytes: `t` is a persistent tensor
    /// with a packed copy ([`Backend::bind_packed`]) and every step of `plan` that reads it can
    /// read the packed copy instead.
    fn can_release_source(&self, mem: &Self::Memory, plan: &Plan, t: TensorId) -> bool;

    /// Frees the bytes of persistent tensor `t` when its packed copy serves every reader in
    /// `plan` ([`Backend::can_release_source`]), so a frozen base is held once; returns whether
    /// it did. The tensor must not be written afterwards; its bytes can still be read back
    /// ([`Backend::unpacked_persistent`]). Release it in every memory that shares it.
    fn release_source(
        &self,
        mem: &mut Self::Memory,
        plan: &Plan,
        t: TensorId,
    ) -> Result<bool, Self::Error>;

    /// Appends the bytes of persistent tensor `t` in its own type to `out`: its bytes, or when
    /// only its packed copy is held ([`Backend::release_source`]), the bytes that copy was
    /// made from (exports and merges of a frozen base).
    fn unpacked_persistent(
        &self,
        mem: &Self::Memory,
        plan: &Plan,
        t: TensorId,
        out: &mut Vec<u8>,
    ) -> Result<(), Self::Error>;

    /// Bytes of the packed copies bound to persistent tensors of `mem` (memory accounting).
    fn packed_persistent_bytes(&self, mem: &Self::Memory) -> usize;

    /// Runs every step of `plan`.
    fn run(&mut self, plan: &Plan, mem: &mut Self::Memory) -> Result<(), Self::Error>;

    /// Runs every step of `plan` and hands out persistent tensors as soon as they are final:
    /// for each `(step, t)` of `watch` (ascending steps; `step` is the last one writing `t`,
    /// [`Plan::last_writes`]), `ready(t, bytes)` is called once with `t`'s bytes after that
    /// step ends, while the later steps may still be running, on one thread, in `watch`'s
    /// order. A data-parallel backward pass starts reducing its first gradients this way
    /// while it computes the rest. This default calls `ready` for every entry after the run,
    /// which is correct for any backend; the CPU calls it mid-run.
    fn run_observed(
        &mut self,
        plan: &Plan,
        mem: &mut Self::Memory,
        watch: &[(usize, TensorId)],
        ready: &Ready<'_>,
    ) -> Result<(), Self::Error> {
        self.run(plan, mem)?;
        for &(_, t) in watch {
            ready(t, self.persistent(mem, plan, t)?);
        }
        Ok(())
    }

    /// Appends the values of F32 output or persistent tensor `t` to `out`.
    fn read_f32(
        &self,
        plan: &Plan,
        mem: &Self::Memory,
        t: TensorId,
        out: &mut Vec<f32>,
    ) -> Result<(), Self::Error>;

    /// The last run's per-step timings as Chrome trace JSON, when tracing is on.
    fn trace(&self, plan: &Plan) -> Option<String>;
}
