//! Builders for reductions and orderings over rows.

use tinynn_format::GgmlType;

use super::{err, Graph, Result};
use crate::ops::Op;
use crate::tensor::{Layout, TensorId};

const F32: GgmlType = GgmlType::F32;

impl Graph {
    /// The sum of all elements, `[1]`.
    pub fn sum(&mut self, a: TensorId) -> Result<TensorId> {
        self.f32_operand("sum", a)?;
        Ok(self.computed(Op::Sum, Layout::contiguous(F32, [1, 1, 1, 1]), vec![a]))
    }

    /// `Σ a²` over all elements, `[1]`, in one pass (no squared copy).
    pub fn sum_sq(&mut self, a: TensorId) -> Result<TensorId> {
        self.f32_operand("sum_sq", a)?;
        Ok(self.computed(Op::SumSq, Layout::contiguous(F32, [1, 1, 1, 1]), vec![a]))
    }

    /// The sum of each row, `[1, ne1, ne2, ne3]`.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId> {
        let la = self.f32_operand("sum_rows", a)?;
        Ok(self.computed(
            Op::SumRows,
            Layout::contiguous(F32, [1, la.ne[1], la.ne[2], la.ne[3]]),
            vec![a],
        ))
    }

    /// The mean of each row, `[1, ne1, ne2, ne3]`.
    pub fn mean(&mut self, a: TensorId) -> Result<TensorId> {
        let la = self.f32_operand("mean", a)?;
        Ok(self.computed(
            Op::Mean,
            Layout::contiguous(F32, [1, la.ne[1], la.ne[2], la.ne[3]]),
            vec![a],
        ))
    }

    /// The index of each row's largest element, I32 `[ne1, ne2, ne3]`.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        let la = self.f32_operand("argmax", a)?;
        let layout = Layout::contiguous(GgmlType::I32, [la.ne[1], la.ne[2], la.ne[3], 1]);
        Ok(self.computed(Op::Argmax, layout, vec![a]))
    }

    /// For each row, the indices that sort it (I32, same shape).
    pub fn argsort(&mut self, a: TensorId, descending: bool) -> Result<TensorId> {
        let la = self.f32_operand("argsort", a)?;
        Ok(self.computed(
            Op::Argsort { descending },
            Layout::contiguous(GgmlType::I32, la.ne),
            vec![a],
        ))
    }

    /// For each row, the indices of its `k` largest elements, largest first (I32 `[k, ne1, ..]`).
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        let la = self.f32_operand("top_k", a)?;
        if k == 0 || k > la.ne[0] {
            return err(
                "top_k",
                format!("k = {k} must be between 1 and the row length {}", la.ne[0]),
            );
        }
        let layout = Layout::contiguous(GgmlType::I32, [k, la.ne[1], la.ne[2], la.ne[3]]);
        Ok(self.computed(Op::TopK { k }, layout, vec![a]))
    }
}
