//! `Wᵀ · dy` (the gradient of mul_mat for its activations) with W in any weight format,
//! dequantized on the fly in chunks: W stays as the file stores it (QLoRA's frozen base).
//!
//! Each thread owns a range of whole blocks of K (the output's rows elements), so it
//! dequantizes only its slice of each weight row; every output element sums over n in
//! ascending order, whatever the thread count.

use super::copy::{read_chunk, CHUNK};
use super::matmul::{gemm_batches, gemm_fits, mul_mat_packed, strided};
use super::{split, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;
use crate::simd::gemm_f32::Gemm;
use tinynn_format::GgmlType;

pub(crate) fn mul_mat_t(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (w, dy, dst) = (a.src(0), a.src(1), a.dst);
    let [k, m, c2, c3] = dst.layout.ne;
    let n = w.layout.ne[1];
    let (r2, r3) = (c2 / w.layout.ne[2], c3 / w.layout.ne[3]);
    if !a.strict && gemm_fits(&[&dst, &w, &dy]) {
        // dst(mi, k) = Σ_n W(k, n) · dy(n, mi): A = W's rows, B = dy's rows.
        return gemm_batches(dst.layout.ne, Some(a), ctx, |i2, i3| Gemm {
            a: strided(&w, (0, i2 / r2, i3 / r3), 1, 0),
            b: strided(&dy, (0, i2, i3), 0, 1),
            c: dst.row_f32_ptr(0, i2, i3),
            cm: dst.layout.nb[1] / 4,
            ni: k,
            nm: m,
            nr: n,
            bf16: a.bf16_matmul,
        });
    }
    if let Some(t) = a.packed.and_then(|p| p.backward()) {
        // Wᵀ requantized to Q8_0: dst = Wᵀ · dy is the forward product of that copy with
        // dy's rows as activations (the executor hands out packed copies only off strict).
        let fits = dy.layout.n_rows() * t.activation_row_bytes() <= a.work_len;
        if fits && dy.layout.dtype == GgmlType::F32 && dst.layout.is_contiguous() {
            return mul_mat_packed(t, a, ctx);
        }
    }
    if !a.strict && quantized_fits(a, &w, &dy, &dst) {
        return mul_mat_t_dequantized(a, ctx);
    }
    if a.source_dropped {
        // Only the packed copy is left (`Memory::drop_packed_source` checks that this product
        // takes the path above); reading the bytes is not an option.
        a.errors.record(ERR_KERNEL, 0);
        return;
    }
    let be = w.layout.dtype.layout().block_elems as usize;
    let blocks = split(k / be, ctx.ith, ctx.nth);
    let (k0, k1) = (blocks.start * be, blocks.end * be);
    let mut buf = [0f32; CHUNK];
    let mut acc = [0f64; CHUNK];
    for i3 in 0..c3 {
        for i2 in 0..c2 {
            let wb = (i2 / r2, i3 / r3);
            let mut c0 = k0;
            while c0 < k1 {
                let len = CHUNK.min(k1 - c0);
                if a.strict {
                    // Reference mode: f64 sums, one output column at a time.
                    for mi in 0..m {
                        acc[..len].fill(0.0);
                        for ni in 0..n {
                            // SAFETY: weight row ni of batch wb exists with contiguous rows;
                            // c0 and len are whole blocks inside it.
                            if !unsafe { read_chunk(&w, (ni, wb.0, wb.1), c0, &mut buf[..len]) } {
                                a.errors.record(ERR_KERNEL, 0);
                            }
                            // SAFETY: (ni, mi, i2, i3) is inside dy.
                            let g = f64::from(unsafe { dy.f32_at([ni, mi, i2, i3]) });
                            for (x, &wv) in acc[..len].iter_mut().zip(&buf[..len]) {
                                *x += g * f64::from(wv);
                            }
                        }
                        for (t, &x) in acc[..len].iter().enumerate() {
                            // SAFETY: element (c0 + t, mi, i2, i3) is this thread's.
                            unsafe { dst.set_float([c0 + t, mi, i2, i3], x as f32) };
                        }
                    }
                } else {
                    // Rows of the output are shared between threads (each owns a slice), so
                    // they are written through raw pointers, never as whole `&mut` rows.
                    for mi in 0..m {
                        let out = dst.row_f32_ptr(mi, i2, i3);
                        for t in c0..c0 + len {
                            // SAFETY: element t of output row (mi, i2, i3) is this thread's.
                            unsafe { out.add(t).write(0.0) };
                        }
                    }
                    for ni in 0..n {
                        // SAFETY: as in the strict branch.
                        if !unsafe { read_chunk(&w, (ni, wb.0, wb.1), c0, &mut buf[..len]) } {
                            a.errors.record(ERR_KERNEL, 0);
                        }
                        for mi in 0..m {
                            // SAFETY: (ni, mi, i2, i3) is inside dy.
                            let g = unsafe { dy.f32_at([ni, mi, i2, i3]) };
                            let out = dst.row_f32_ptr(mi, i2, i3).wrapping_add(c0);
                            for (t, &wv) in buf[..len].iter().enumerate() {
                                // SAFETY: elements c0..c0+len of the row are this thread's.
                                unsafe { out.add(t).write(out.add(t).read() + g * wv) };
                            }
                        }
                    }
                }
                c0 += len;
            }
        }
    }
}

/// Rows of a non-F32 weight dequantized per pass of [`mul_mat_t_dequantized`].
const DEQUANT_ROWS: usize = crate::plan_work::MUL_MAT_T_PANEL_ROWS;

/// Work bytes [`mul_mat_t_dequantized`] needs for a weight `[k, n]` and `m` output rows: a
/// panel of `min(n, DEQUANT_ROWS)` dequantized rows and one `[k, m]` partial product (as
/// `crate::plan_work::work_bytes` reserves them).
fn dequant_work_bytes(k: usize, n: usize, m: usize) -> usize {
    4 * k * (n.min(DEQUANT_ROWS) + m)
}

/// Whether the dequantizing GEMM path takes this product: a 2-D non-F32 weight, F32 `dy` and
/// a contiguous F32 output, the GEMM kernel present, and work space for it.
fn quantized_fits(
    a: &StepArgs<'_>,
    w: &super::RawTensor,
    dy: &super::RawTensor,
    dst: &super::RawTensor,
) -> bool {
    let [k, m, c2, c3] = dst.layout.ne;
    w.layout.dtype != tinynn_format::GgmlType::F32
        && w.layout.ne[2] == 1
        && w.layout.ne[3] == 1
        && c2 == 1
        && c3 == 1
        && dst.layout.is_contiguous()
        && gemm_fits(&[dst, dy])
        && a.work_len >= dequant_work_bytes(k, w.layout.ne[1], m)
}

/// `dst = Wᵀ · dy` for a weight in any format: `DEQUANT_ROWS` rows of W at a time are
/// dequantized into the work buffer (threads split the rows), then multiplied with the f32
/// GEMM into `dst` (first panel) or into a partial product added to `dst` (threads split the
/// rows of `dst`). Panels are fixed, so the result does not depend on the thread count.
fn mul_mat_t_dequantized(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (w, dy, dst) = (a.src(0), a.src(1), a.dst);
    let [k, m, _, _] = dst.layout.ne;
    let n = w.layout.ne[1];
    let rows = n.min(DEQUANT_ROWS);
    let panel = a.work as *mut f32;
    let partial = panel.wrapping_add(rows * k);
    let mut n0 = 0;
    while n0 < n {
        let nr = rows.min(n - n0);
        for r in split(nr, ctx.ith, ctx.nth) {
            // SAFETY: panel row r (k f32s) is inside the work buffer (checked by
            // quantized_fits) and this thread's.
            let out = unsafe { std::slice::from_raw_parts_mut(panel.add(r * k), k) };
            let ok = match a.packed {
                // The same values from the packed copy (the file's bytes, block by block).
                Some(p) => p.dequantize_row(n0 + r, out),
                // SAFETY: weight row n0 + r exists with contiguous rows.
                None => unsafe { read_chunk(&w, (n0 + r, 0, 0), 0, out) },
            };
            if !ok {
                a.errors.record(ERR_KERNEL, 0);
            }
        }
        if ctx.barrier().is_err() {
            return;
        }
        let (c, cm) = if n0 == 0 {
            (dst.row_f32_ptr(0, 0, 0), dst.layout.nb[1] / 4)
        } else {
            (partial, k)
        };
        // dst(mi, i) = Σ_r panel(i, r) · dy(n0 + r, mi): A = the panel's rows, B = dy's.
        let dy0 = dy.ptr.wrapping_add(n0 * dy.layout.nb[0]);
        gemm_batches([k, m, 1, 1], None, ctx, |_, _| Gemm {
            a: crate::simd::gemm_f32::Strided {
                ptr: panel as *const f32,
                rs: k,
                xs: 1,
            },
            b: crate::simd::gemm_f32::Strided {
                ptr: dy0 as *const f32,
                rs: dy.layout.nb[0] / 4,
                xs: dy.layout.nb[1] / 4,
            },
            c,
            cm,
            ni: k,
            nm: m,
            nr,
            bf16: a.bf16_matmul,
        });
        if ctx.barrier().is_err() {
            return;
        }
        if n0 > 0 {
            for mi in split(m, ctx.ith, ctx.nth) {
                let out = dst.row_f32_ptr(mi, 0, 0);
                for i in 0..k {
                    // SAFETY: row mi of dst (k f32s) is this thread's; the partial product
                    // holds m rows of k (written before the barrier).
                    unsafe {
                        out.add(i)
                            .write(out.add(i).read() + partial.add(mi * k + i).read())
                    };
                }
            }
            if ctx.barrier().is_err() {
                return;
            }
        }
        n0 += nr;
    }
}
