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
        let ok = match a.packed {
            // The same values from the packed copy (its bytes may be gone).
            Some(p) => p.dequantize_row(r as usize, out),
            None => {
                // SAFETY: 0 <= r < ne1 and the table's rows are contiguous.
                let src = unsafe { table.row(r as usize, 0, 0) };
                quant::dequantize_row(table.layout.dtype, src, out).is_ok()
            }
        };
        if !ok {
            a.errors.record(ERR_KERNEL, 0);
        }
    }
}

pub(crate) fn set_rows(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (dst, src, idx) = (a.dst, a.src(1), a.src(2));
    // SAFETY: indices are a contiguous I32 [n] tensor (builder-checked).
    let indices = unsafe { idx.i32s() };
    let n_rows = dst.layout.ne[1];
    for (i, &r) in indices.iter().enumerate() {
        if r < 0 || r as usize >= n_rows {
            if ctx.ith == 0 {
                a.errors.record(ERR_INDEX, r as u32);
            }
            continue;
        }
        // Each destination row belongs to one thread, so repeated indices are written in
        // order: row r to thread (r + step) % n, so a token's K and V cache writes (one row
        // each, neighbouring steps of one group) go to different threads.
        if (r as usize + a.step) % ctx.nth != ctx.ith {
            continue;
        }
        // SAFETY: row i of src and row r of dst exist; dst row r is written by this thread only.
        if !unsafe { super::copy::convert_row(&src, (i, 0, 0), &dst, (r as usize, 0, 0)) } {
            a.errors.record(ERR_KERNEL, 0);
        }
    }
}
