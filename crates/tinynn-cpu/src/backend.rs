//! The CPU executor as a [`Backend`]: plans with the CPU kernels' scratch, memories that own
//! their weights' stores, weights repacked into the 16-row interleaved layout, runs on the
//! process-wide thread pool. Persistent tensors are host bytes: views borrow them, fills write
//! them in place, and a frozen tensor read only by products and row lookups can keep just its
//! packed copy (`Memory::drop_packed_source`).

use std::sync::Arc;

use tinynn_core::backend::{Backend, Ready, WeightRef};
use tinynn_core::graph::Graph;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use crate::packed::PackedWeight;
use crate::{ExecError, Executor, Memory, MemoryError};

impl Backend for Executor {
    type Memory = Memory<'static>;
    type Packed = PackedWeight;
    type Error = ExecError;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn compile(&self, graph: Graph) -> Plan {
        crate::compile(graph)
    }

    fn new_memory(&self, plan: &Plan, shared: &[TensorId]) -> Result<Memory<'static>, ExecError> {
        Ok(Memory::try_new_sharing(plan, shared)?)
    }

    fn bind_weight(
        &self,
        mem: &mut Memory<'static>,
        plan: &Plan,
        t: TensorId,
        weight: WeightRef,
    ) -> Result<(), ExecError> {
        Ok(mem.bind_weight_shared(plan, t, weight)?)
    }

    fn pack(&self, dtype: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<PackedWeight> {
        crate::packed::pack(dtype, ne, bytes)
    }

    fn pack_backward(&self, packed: &mut PackedWeight) -> bool {
        packed.add_backward_q8_0()
    }

    fn packed_bytes(packed: &PackedWeight) -> usize {
        packed.bytes()
    }

    fn bind_packed(
        &self,
        mem: &mut Memory<'static>,
        plan: &Plan,
        t: TensorId,
        packed: Arc<PackedWeight>,
    ) -> Result<(), ExecError> {
        Ok(mem.bind_packed(plan, t, packed)?)
    }

    fn write(
        &self,
        mem: &mut Memory<'static>,
        plan: &Plan,
        t: TensorId,
        offset: usize,
        bytes: &[u8],
    ) -> Result<(), ExecError> {
        let dst = mem.persistent_mut(plan, t)?;
        let len = dst.len();
        let Some(dst) = dst.get_mut(offset..offset.saturating_add(bytes.len())) else {
            let name = plan.graph().node(t).name.clone();
            return Err(MemoryError::WrongSize {
                name,
                need: len,
                got: offset.saturating_add(bytes.len()),
            }
            .into());
        };
        dst.copy_from_slice(bytes);
        Ok(())
    }

    fn swap(
        &self,
        mem: &mut Memory<'static>,
        plan: &Plan,
        t: TensorId,
        other: &mut Memory<'static>,
        other_plan: &Plan,
        other_t: TensorId,
    ) -> Result<(), ExecError> {
        Ok(mem.swap_persistent(plan, t, other, other_plan, other_t)?)
    }

    fn persistent_len(&self, mem: &Memory<'static>, plan: &Plan, t: TensorId) -> usize {
        mem.persistent(plan, t).map_or(0, <[u8]>::len)
    }

    fn persistent<'a>(
        &'a self,
        mem: &'a Memory<'static>,
        plan: &Plan,
        t: TensorId,
    ) -> Result<&'a [u8], ExecError> {
        Ok(mem.persistent(plan, t)?)
    }

    fn fill_persistent(
        &self,
        mem: &mut Memory<'static>,
        plan: &Plan,
        t: TensorId,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), ExecError> {
        fill(mem.persistent_mut(plan, t)?);
        Ok(())
    }

    fn zero(&self, mem: &mut Memory<'static>, plan: &Plan, t: TensorId) -> Result<(), ExecError> {
        Ok(mem.zero_persistent(plan, t)?)
    }

    fn can_release_source(&self, mem: &Memory<'static>, plan: &Plan, t: TensorId) -> bool {
        mem.can_drop_packed_source(plan, t)
    }

    fn release_source(
        &self,
        mem: &mut Memory<'static>,
        plan: &Plan,
        t: TensorId,
    ) -> Result<bool, ExecError> {
        Ok(mem.drop_packed_source(plan, t)?)
    }

    fn unpacked_persistent(
        &self,
        mem: &Memory<'static>,
        plan: &Plan,
        t: TensorId,
        out: &mut Vec<u8>,
    ) -> Result<(), ExecError> {
        let bytes = mem.persistent(plan, t)?;
        let need = plan.graph().layout(t).contiguous_bytes();
        if bytes.len() == need {
            out.extend_from_slice(bytes);
            return Ok(());
        }
        // Only the packed copy is held (`Memory::drop_packed_source`): its rows unpack to the
        // exact bytes it was made from.
        let Some(p) = mem.packed_persistent(plan, t) else {
            return Err(MemoryError::NotPresent(plan.graph().node(t).name.clone()).into());
        };
        let rb = p.row_bytes();
        let start = out.len();
        out.resize(start + rb * p.shape()[1], 0);
        for (n, row) in out[start..].chunks_exact_mut(rb).enumerate() {
            p.unpack_row(n, row);
        }
        Ok(())
    }

    fn packed_persistent_bytes(&self, mem: &Memory<'static>) -> usize {
        mem.packed_persistent_bytes()
    }

    fn run(&mut self, plan: &Plan, mem: &mut Memory<'static>) -> Result<(), ExecError> {
        Executor::run(self, plan, mem)
    }

    fn run_observed(
        &mut self,
        plan: &Plan,
        mem: &mut Memory<'static>,
        watch: &[(usize, TensorId)],
        ready: &Ready<'_>,
    ) -> Result<(), ExecError> {
        Executor::run_observed(self, plan, mem, watch, ready)
    }

    fn read_f32(
        &self,
        plan: &Plan,
        mem: &Memory<'static>,
        t: TensorId,
        out: &mut Vec<f32>,
    ) -> Result<(), ExecError> {
        let layout = plan.graph().layout(t);
        if layout.dtype != GgmlType::F32 {
            return Err(MemoryError::WrongType {
                name: plan.graph().node(t).name.clone(),
                dtype: layout.dtype,
                want: GgmlType::F32,
            }
            .into());
        }
        let bytes = self.bytes(plan, mem, t)?;
        out.extend(
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        Ok(())
    }

    fn trace(&self, plan: &Plan) -> Option<String> {
        self.chrome_trace(plan)
    }
}
