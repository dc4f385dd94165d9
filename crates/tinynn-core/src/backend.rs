//! The boundary between a compiled [`Plan`] and the hardware that runs it. Models build graphs
//! and plans; a backend owns the memory and runs them. The CPU backend is
//! `tinynn_cpu::Executor`; a GPU backend implements the same trait without touching models.

use crate::plan::Plan;
use crate::tensor::TensorId;

pub trait Backend {
    /// Weights bound for, and persistent tensors owned on behalf of, one plan.
    type Memory<'w>;
    type Error: std::error::Error + Send + Sync + 'static;

    fn name(&self) -> &'static str;

    /// Fresh memory for `plan`: weights unbound, persistent tensors zero.
    fn new_memory<'w>(&self, plan: &Plan) -> Self::Memory<'w>;

    /// Binds the bytes of weight `t` (a view of a model file, normally an mmap).
    fn bind_weight<'w>(
        &self,
        mem: &mut Self::Memory<'w>,
        plan: &Plan,
        t: TensorId,
        bytes: &'w [u8],
    ) -> Result<(), Self::Error>;

    /// Overwrites the start of persistent tensor `t` with `bytes` (inputs before a run).
    fn write(
        &self,
        mem: &mut Self::Memory<'_>,
        plan: &Plan,
        t: TensorId,
        bytes: &[u8],
    ) -> Result<(), Self::Error>;

    /// Runs every step of `plan`.
    fn run(&mut self, plan: &Plan, mem: &mut Self::Memory<'_>) -> Result<(), Self::Error>;

    /// Copies the bytes of output or persistent tensor `t` into `out` (exactly its size).
    fn read(
        &self,
        plan: &Plan,
        mem: &Self::Memory<'_>,
        t: TensorId,
        out: &mut [u8],
    ) -> Result<(), Self::Error>;
}
