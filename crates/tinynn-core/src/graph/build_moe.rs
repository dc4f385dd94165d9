//! Builders for the mixture-of-experts ops past `mul_mat_id` (in `build_extra`): picking the
//! routing weights of each token's chosen experts, and the gradients of the expert products.

use tinynn_format::GgmlType;

use super::{err, Graph, Result};
use crate::ops::Op;
use crate::quant;
use crate::tensor::{Layout, TensorId};

const F32: GgmlType = GgmlType::F32;

impl Graph {
    /// Per column, the elements `ids` names: `out[j, t] = a[ids[j, t], t]` for a F32 `[N, n]`
    /// and I32 ids `[k, n]` → F32 `[k, n]`. An id past N is an error at run time.
    pub fn take_rows(&mut self, a: TensorId, ids: TensorId) -> Result<TensorId> {
        const OP: &str = "take_rows";
        let la = self.f32_operand(OP, a)?;
        if la.ne[2] * la.ne[3] != 1 {
            return err(OP, format!("expects a 2-D [N, n], got {:?}", la.ne));
        }
        self.check_id(OP, ids)?;
        let k = self.layout(ids).ne[0];
        self.ids_operand(OP, ids, k, la.ne[1])?;
        Ok(self.computed(
            Op::TakeRows,
            Layout::contiguous(F32, [k, la.ne[1], 1, 1]),
            vec![a, ids],
        ))
    }

    /// Gradient of [`Graph::take_rows`]: dy `[k, n]` added into elements `(ids[j, t], t)` of
    /// a zero F32 `[n_rows, n]`.
    pub fn take_rows_back(
        &mut self,
        dy: TensorId,
        ids: TensorId,
        n_rows: usize,
    ) -> Result<TensorId> {
        const OP: &str = "take_rows_back";
        let ld = self.f32_operand(OP, dy)?;
        if ld.ne[2] * ld.ne[3] != 1 || n_rows == 0 {
            return err(OP, format!("expects dy [k, n] and rows, got {:?}", ld.ne));
        }
        self.ids_operand(OP, ids, ld.ne[0], ld.ne[1])?;
        Ok(self.computed(
            Op::TakeRowsBack,
            Layout::contiguous(F32, [n_rows, ld.ne[1], 1, 1]),
            vec![dy, ids],
        ))
    }

    /// Gradient of [`Graph::mul_mat_id`] for its activations: experts `[K, N, n_expert]` (any
    /// weight type, contiguous rows), dy F32 `[N, n_used, n_tokens]`, I32 ids
    /// `[n_used, n_tokens]` → F32 `[K, n_used, n_tokens]` (summed over slots by the caller
    /// when the activations were shared by every slot).
    pub fn mul_mat_id_t(
        &mut self,
        experts: TensorId,
        dy: TensorId,
        ids: TensorId,
    ) -> Result<TensorId> {
        const OP: &str = "mul_mat_id_t";
        self.check_id(OP, experts)?;
        let le = *self.layout(experts);
        let ld = self.f32_operand(OP, dy)?;
        if quant::row_bytes(le.dtype, le.ne[0]).is_err() || !le.rows_contiguous() || le.ne[3] != 1 {
            return err(
                OP,
                format!(
                    "experts must be [K, N, n_expert] with contiguous rows, got {} {:?}",
                    le.dtype, le.ne
                ),
            );
        }
        if ld.ne[0] != le.ne[1] || ld.ne[3] != 1 {
            return err(
                OP,
                format!("dy {:?} does not fit experts {:?}", ld.ne, le.ne),
            );
        }
        self.ids_operand(OP, ids, ld.ne[1], ld.ne[2])?;
        Ok(self.computed(
            Op::MulMatIdT,
            Layout::contiguous(F32, [le.ne[0], ld.ne[1], ld.ne[2], 1]),
            vec![experts, dy, ids],
        ))
    }

    /// Gradient of [`Graph::mul_mat_id`] for its experts: activations x F32
    /// `[K, 1 or n_used, n_tokens]`, dy F32 `[N, n_used, n_tokens]`, I32 ids → F32
    /// `[K, N, n_expert]`, each expert's sum of `x ⊗ dy` over the (slot, token) pairs routed
    /// to it.
    pub fn out_prod_id(
        &mut self,
        x: TensorId,
        dy: TensorId,
        ids: TensorId,
        n_expert: usize,
    ) -> Result<TensorId> {
        const OP: &str = "out_prod_id";
        let lx = self.f32_operand(OP, x)?;
        let ld = self.f32_operand(OP, dy)?;
        let n_used = ld.ne[1];
        if lx.ne[2] != ld.ne[2]
            || lx.ne[3] != 1
            || ld.ne[3] != 1
            || (lx.ne[1] != 1 && lx.ne[1] != n_used)
            || n_expert == 0
        {
            return err(OP, format!("x {:?} does not fit dy {:?}", lx.ne, ld.ne));
        }
        self.ids_operand(OP, ids, n_used, ld.ne[2])?;
        Ok(self.computed(
            Op::OutProdId,
            Layout::contiguous(F32, [lx.ne[0], ld.ne[0], n_expert, 1]),
            vec![x, dy, ids],
        ))
    }
}
