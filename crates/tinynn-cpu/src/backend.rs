//! The CPU executor as a [`Backend`].

use tinynn_core::backend::Backend;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;

use crate::{ExecError, Executor, Memory, MemoryError};

impl Backend for Executor {
    type Memory<'w> = Memory<'w>;
    type Error = ExecError;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn new_memory<'w>(&self, plan: &Plan) -> Memory<'w> {
        Memory::new(plan)
    }

    fn bind_weight<'w>(
        &self,
        mem: &mut Memory<'w>,
        plan: &Plan,
        t: TensorId,
        bytes: &'w [u8],
    ) -> Result<(), ExecError> {
        Ok(mem.bind_weight(plan, t, bytes)?)
    }

    fn write(
        &self,
        mem: &mut Memory<'_>,
        plan: &Plan,
        t: TensorId,
        bytes: &[u8],
    ) -> Result<(), ExecError> {
        let dst = mem.persistent_mut(plan, t)?;
        let Some(dst) = dst.get_mut(..bytes.len()) else {
            let name = plan.graph().node(t).name.clone();
            return Err(MemoryError::WrongSize {
                name,
                need: dst.len(),
                got: bytes.len(),
            }
            .into());
        };
        dst.copy_from_slice(bytes);
        Ok(())
    }

    fn run(&mut self, plan: &Plan, mem: &mut Memory<'_>) -> Result<(), ExecError> {
        Executor::run(self, plan, mem)
    }

    fn read(
        &self,
        plan: &Plan,
        mem: &Memory<'_>,
        t: TensorId,
        out: &mut [u8],
    ) -> Result<(), ExecError> {
        let bytes = self.bytes(plan, mem, t)?;
        if bytes.len() != out.len() {
            let name = plan.graph().node(t).name.clone();
            return Err(MemoryError::WrongSize {
                name,
                need: bytes.len(),
                got: out.len(),
            }
            .into());
        }
        out.copy_from_slice(bytes);
        Ok(())
    }
}
