//! get_rows: rows of a table (any supported type) picked by run-time indices, as f32.

use tinynn_core::quant;

use super::{split, StepArgs, ERR_INDEX, ERR_KERNEL};
use crate::pool::Ctx;

pub(crate) fn get_rows(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (table, idx) = (a.src(0), a.src(1));
    // SAFETY: indices are a contiguous 1-D I32 tensor (builder-checked).
    let indices = unsafe { idx.i32s() };
    let n_rows = table.layout.ne[1];
    for n in split(indices.len(), ctx.ith, ctx.nth) {
        // SAFETY: output row n is this thread's; the output is contiguous F32 [K, n].
        let out = unsafe { a.dst.row_f32_mut(n, 0, 0) };
        let r = indices[n];
        if r < 0 || r as usize >= n_rows {
            out.fill(0.0);
            a.errors.record(ERR_INDEX, r as u32);
            continue;
        }
        // SAFETY: 0 <= r < ne1 and the table's rows are contiguous.
        let src = unsafe { table.row(r as usize, 0, 0) };
        if quant::dequantize_row(table.layout.dtype, src, out).is_err() {
            a.errors.record(ERR_KERNEL, 0);
        }
    }
}
