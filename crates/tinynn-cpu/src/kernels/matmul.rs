//! mul_mat: each thread converts its share of the activation rows into the weight format's
//! dot type (in the step's work buffer), a barrier, then each thread computes its share of the
//! output columns (weight rows) for every activation row.

use tinynn_core::quant;
use tinynn_core::tensor::Layout;
use tinynn_format::GgmlType;

use super::copy::{convert_activations, read_chunk, CHUNK};
use super::elementwise::GluRow;
use super::{row_index, split, RawTensor, StepArgs, ERR_KERNEL};
use crate::packed::PackedWeight;
use crate::pool::Ctx;
use crate::simd;
use crate::simd::gemm_f32::{self, Gemm, Strided};

/// Whether the AVX-512 f32 GEMM takes a product of these tensors: all F32 with strides in
/// whole elements, the output (the first) with contiguous rows.
pub(crate) fn gemm_fits(ts: &[&RawTensor]) -> bool {
    gemm_f32::available()
        && ts[0].layout.nb[0] == 4
        && ts
            .iter()
            .all(|t| t.layout.dtype == GgmlType::F32 && t.layout.nb.iter().all(|b| b % 4 == 0))
}

/// `t` from element `(0, i1, i2, i3)` as a [`Strided`] whose `r` and `x` steps are the
/// tensor's dimensions `r_dim` and `x_dim`.
pub(crate) fn strided(
    t: &RawTensor,
    (i1, i2, i3): (usize, usize, usize),
    r_dim: usize,
    x_dim: usize,
) -> Strided {
    Strided {
        ptr: t.row_f32_ptr(i1, i2, i3),
        rs: t.layout.nb[r_dim] / 4,
        xs: t.layout.nb[x_dim] / 4,
    }
}

/// Runs the GEMM `make(i2, i3)` of every batch of an output shaped `ne`, the jobs of all
/// batches split over the threads. Each output block is computed by one thread, whichever it
/// is, so the result depends neither on the thread count nor on the split. With `shared` (the
/// step's one GEMM, its claim counter free: [`StepArgs::claimable`]) the jobs are handed out
/// as [`StepArgs::for_shares`] does (a share each, and the others' last jobs to a thread that
/// is done); otherwise each thread takes its static run of about equal work
/// ([`Gemm::thread_jobs`]). A static split lost 11–13% of SmolLM2's LoRA step's products to
/// one thread waiting for the other on this (shared, noisy) host.
pub(crate) fn gemm_batches(
    ne: [usize; 4],
    shared: Option<&StepArgs<'_>>,
    ctx: &Ctx<'_>,
    make: impl Fn(usize, usize) -> Gemm,
) {
    let first = make(0, 0);
    let batches = ne[2] * ne[3];
    let ig = first.tiles_per_job(batches, ctx.nth);
    let per = first.jobs(ig);
    let run = |job: usize| {
        let b = job / per;
        // SAFETY: gemm_fits() checked the ISA and dtypes; the callers build each batch's
        // operands inside its tensors (builder-checked shapes), dst never overlaps a source,
        // and output block `job` is this thread's alone (static runs and claimed ranges are
        // disjoint).
        unsafe { make(b % ne[2], b / ne[2]).run_job(job % per, ig) };
    };
    match shared {
        Some(a) if a.claimable && ctx.nth > 1 => {
            a.for_shares(per * batches, ctx.ith, ctx.nth, |jobs| jobs.for_each(run))
        }
        _ => first
            .thread_jobs(ig, batches, ctx.ith, ctx.nth)
            .for_each(run),
    }
}

/// Phase 1 of a matrix product with weights `w`: every thread converts its share of the rows
/// of `x` into the weights' dot type in the step's work buffer, then all meet at a barrier.
/// Returns the work buffer as a contiguous `[K, rows]` tensor and the dot kernel, or `None`
/// (recorded as an error) — the same answer on every thread, so none waits alone — or when
/// the barrier was poisoned (another thread panicked: the work buffer is incomplete).
pub(crate) fn prepare_activations(
    a: &StepArgs<'_>,
    w: &RawTensor,
    x: &RawTensor,
    ctx: &Ctx<'_>,
) -> Option<(RawTensor, simd::DotFn)> {
    let k = w.layout.ne[0];
    let (Ok(dot_ty), Some(dot)) = (
        quant::vec_dot_type(w.layout.dtype),
        simd::dot_fn(w.layout.dtype),
    ) else {
        a.errors.record(ERR_KERNEL, 0);
        return None;
    };
    let x_rows = x.layout.n_rows();
    let fits = quant::row_bytes(dot_ty, k).is_ok_and(|row_b| row_b * x_rows <= a.work_len);
    if !fits {
        a.errors.record(ERR_KERNEL, 0);
        return None;
    }
    let work = RawTensor {
        ptr: a.work,
        layout: Layout::contiguous(dot_ty, [k, x_rows, 1, 1]),
    };
    for r in split(x_rows, ctx.ith, ctx.nth) {
        // SAFETY: row r of x exists; work row r is inside the work buffer (checked above) and
        // belongs to this thread.
        if !unsafe { convert_activations(x, row_index(&x.layout, r), &work, (r, 0, 0)) } {
            a.errors.record(ERR_KERNEL, 0);
        }
    }
    ctx.barrier().ok()?;
    Some((work, dot))
}

pub(crate) fn mul_mat(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    if a.strict {
        return mul_mat_strict(a, ctx);
    }
    let (w, x, dst) = (a.src(0), a.src(1), a.dst);
    if let Some(p) = a.packed {
        let fits = x.layout.n_rows() * p.activation_row_bytes() <= a.work_len;
        if fits && x.layout.dtype == GgmlType::F32 && dst.layout.is_contiguous() {
            return mul_mat_packed(p, a, ctx);
        }
    }
    if a.source_dropped {
        // Only the packed copy is left and it could not take this product (a planner bug).
        a.errors.record(ERR_KERNEL, 0);
        return;
    }
    if gemm_fits(&[&dst, &w, &x]) {
        // dst(n, mi) = Σ_k W(k, n) · x(k, mi): A = W (transposed packing), B = x's rows.
        let [n_out, m, c2, c3] = dst.layout.ne;
        let (r2, r3) = (c2 / w.layout.ne[2], c3 / w.layout.ne[3]);
        return gemm_batches(dst.layout.ne, Some(a), ctx, |i2, i3| Gemm {
            a: strided(&w, (0, i2 / r2, i3 / r3), 0, 1),
            b: strided(&x, (0, i2, i3), 0, 1),
            c: dst.row_f32_ptr(0, i2, i3),
            cm: dst.layout.nb[1] / 4,
            ni: n_out,
            nm: m,
            nr: w.layout.ne[0],
            bf16: a.bf16_matmul,
        });
    }
    let Some((work, dot)) = prepare_activations(a, &w, &x, ctx) else {
        return;
    };
    let [n_out, m, c2, c3] = dst.layout.ne;
    let (r2, r3) = (c2 / w.layout.ne[2], c3 / w.layout.ne[3]);
    let dot4 = simd::dot4_fn(w.layout.dtype);
    for n in split(n_out, ctx.ith, ctx.nth) {
        for i3 in 0..c3 {
            for i2 in 0..c2 {
                // SAFETY: weight row n of batch (i2/r2, i3/r3) exists and has contiguous rows.
                let wrow = unsafe { w.row(n, i2 / r2, i3 / r3) };
                let mut mi = 0;
                if let Some(dot4) = dot4 {
                    // Four activation rows per pass (the same bits as one at a time).
                    while mi + 4 <= m {
                        let xr = mi + m * (i2 + c2 * i3);
                        // SAFETY: work rows xr..xr+4 were written before the barrier.
                        let xs = std::array::from_fn(|r| unsafe { work.row(xr + r, 0, 0) });
                        for (r, v) in dot4(wrow, xs).into_iter().enumerate() {
                            // SAFETY: element (n, mi + r, i2, i3) is inside dst; column n is
                            // this thread's.
                            unsafe { dst.set_float([n, mi + r, i2, i3], v) };
                        }
                        mi += 4;
                    }
                }
                for mi in mi..m {
                    let xr = mi + m * (i2 + c2 * i3);
                    // SAFETY: work row xr was written before the barrier.
                    let xrow = unsafe { work.row(xr, 0, 0) };
                    let v = dot(wrow, xrow);
                    // SAFETY: element (n, mi, i2, i3) is inside dst; column n is this thread's.
                    unsafe { dst.set_float([n, mi, i2, i3], v) };
                }
            }
        }
    }
}

/// A product with a packed weight (see `crate::packed`): each thread prepares its share of
/// the activation rows (quantized, or rounded to f16) into the work buffer, a barrier, then each thread runs its share of the
/// 16-row groups over all rows. `dst` is contiguous F32 `[n, rows…]`.
pub(super) fn mul_mat_packed(p: &PackedWeight, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, dst) = (a.src(1), a.dst);
    let (k, rows, arb) = (x.layout.ne[0], x.layout.n_rows(), p.activation_row_bytes());
    if rows <= FEW_ROWS && x.layout.nb[0] == 4 {
        return mul_mat_packed_few(p, a, ctx);
    }
    let mut buf = [0f32; CHUNK];
    for r in split(rows, ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&x.layout, r);
        // SAFETY: row r of the work buffer (rows·arb bytes, checked by the caller) is this
        // thread's.
        let out = unsafe { std::slice::from_raw_parts_mut(a.work.add(r * arb), arb) };
        if x.layout.nb[0] == 4 {
            // SAFETY: row r of x holds k contiguous f32s.
            p.prepare_activations(unsafe { x.row_f32(i1, i2, i3) }, out);
            continue;
        }
        let mut c0 = 0;
        while c0 < k {
            let len = CHUNK.min(k - c0);
            // SAFETY: row r of x exists; F32 rows need no contiguity.
            if !unsafe { read_chunk(&x, (i1, i2, i3), c0, &mut buf[..len]) } {
                a.errors.record(ERR_KERNEL, 0);
            }
            p.prepare_activations(
                &buf[..len],
                &mut out[p.activation_bytes(c0)..][..p.activation_bytes(len)],
            );
            c0 += len;
        }
    }
    if ctx.barrier().is_err() {
        return;
    }
    a.for_shares(p.n_groups(), ctx.ith, ctx.nth, |groups| {
        // SAFETY: the work buffer holds every activation row (barrier above); dst is
        // contiguous F32 with `rows` rows of n_rows values, and the handed-out groups' columns
        // are this thread's alone.
        unsafe {
            p.matmul_raw(
                a.work,
                arb,
                rows,
                dst.ptr as *mut f32,
                dst.layout.nb[1] / 4,
                groups,
            )
        };
    });
}

/// Activation rows up to which every thread prepares all of them itself (decode): repeating
/// a few hundred conversions is cheaper than the barrier that sharing them would need.
const FEW_ROWS: usize = 8;

thread_local! {
    /// Each pool thread's prepared activations for [`mul_mat_packed_few`].
    static FEW_ACTS: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`mul_mat_packed`] for at most [`FEW_ROWS`] contiguous activation rows, without a barrier:
/// each thread prepares every row in its own buffer, then runs its groups.
fn mul_mat_packed_few(p: &PackedWeight, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    packed_few(a, &[(p, a.dst)], None, ctx);
}

/// A gated unit computed as the epilogue of its gate and up products: the op (`SwiGlu` or
/// `GeGlu`) and its output.
pub(crate) type GluEpilogue = (tinynn_core::ops::Op, RawTensor);

/// Several decode products of one activation (`parts`, the steps of a fused run: the
/// executor's `fused`) as one range of 16-row groups, as [`mul_mat_packed_few`] runs one: each
/// thread prepares the activation rows once, and its share may run from one weight into the
/// next. False, having done nothing, unless every part has a packed weight of the same
/// activation format and length, a contiguous output and the same contiguous F32 activation
/// of at most [`FEW_ROWS`] rows (decode). With `glu`, the parts are a gate and an up product
/// of one shape whose outputs the gated unit reads (`executor::fused::glu_epilogues` checked
/// the tensors): the range is of pairs of groups, and the thread that computed a pair
/// computes the unit's output on its columns.
pub(crate) fn mul_mat_fused(
    parts: &[StepArgs<'_>],
    glu: Option<GluEpilogue>,
    ctx: &Ctx<'_>,
) -> bool {
    const MAX: usize = crate::executor::MAX_FUSED;
    let Some(first) = parts.first() else {
        return false;
    };
    let x = first.src(1);
    if first.strict
        || parts.len() > MAX
        || x.layout.n_rows() > FEW_ROWS
        || x.layout.nb[0] != 4
        || x.layout.dtype != GgmlType::F32
    {
        return false;
    }
    let Some(p0) = first.packed else {
        return false;
    };
    let format = (p0.kind().activation_format(), p0.activation_row_bytes());
    let mut list = [(p0, first.dst); MAX];
    for (l, a) in list.iter_mut().zip(parts) {
        let Some(p) = a.packed else { return false };
        let y = a.src(1);
        if y.ptr != x.ptr
            || y.layout != x.layout
            || !a.dst.layout.is_contiguous()
            || (p.kind().activation_format(), p.activation_row_bytes()) != format
        {
            return false;
        }
        *l = (p, a.dst);
    }
    let glu = match glu {
        None => None,
        Some((op, out)) => {
            let Some(row) = super::elementwise::glu_row(op) else {
                return false;
            };
            let pair = parts.len() == 2 && list[0].0.shape() == list[1].0.shape();
            let same = |t: &RawTensor| t.layout == out.layout && t.layout.dtype == GgmlType::F32;
            if !(pair && same(&list[0].1) && same(&list[1].1)) {
                return false;
            }
            Some((row, out))
        }
    };
    packed_few(first, &list[..parts.len()], glu, ctx);
    true
}

/// The gated unit's row kernel and output, for [`packed_few`].
type GluRows = (GluRow, RawTensor);

/// The body of [`mul_mat_packed_few`] and [`mul_mat_fused`]: `parts` are (weight, output)
/// pairs read against `a`'s activation (source 1, contiguous F32 rows), all weights of one
/// activation format and length; their 16-row groups are one range handed out with `a`'s
/// work counter (part j's groups follow part j − 1's); with `glu`, as pairs (see
/// [`mul_mat_fused`]).
fn packed_few(
    a: &StepArgs<'_>,
    parts: &[(&PackedWeight, RawTensor)],
    glu: Option<GluRows>,
    ctx: &Ctx<'_>,
) {
    let Some(&(p0, _)) = parts.first() else {
        return;
    };
    let x = a.src(1);
    let (rows, arb) = (x.layout.n_rows(), p0.activation_row_bytes());
    let total: usize = parts.iter().map(|(p, _)| p.n_groups()).sum();
    FEW_ACTS.with_borrow_mut(|acts| {
        if acts.len() < rows * arb {
            acts.resize(rows * arb, 0);
        }
        for r in 0..rows {
            let (i1, i2, i3) = row_index(&x.layout, r);
            // SAFETY: row r of x holds k contiguous f32s (checked by the callers).
            p0.prepare_activations(
                unsafe { x.row_f32(i1, i2, i3) },
                &mut acts[r * arb..][..arb],
            );
        }
        if let Some((row, out)) = glu {
            // SAFETY: as below; the pair's two outputs and `out` have one contiguous F32
            // shape, and the columns of the handed-out groups are this thread's in all three.
            a.for_shares(p0.n_groups(), ctx.ith, ctx.nth, |range| unsafe {
                glu_pairs(parts, (acts.as_ptr(), arb, rows), range, row, &out)
            });
            return;
        }
        a.for_shares(total, ctx.ith, ctx.nth, |range| {
            let mut start = 0;
            for &(p, dst) in parts {
                let (lo, hi) = (range.start.max(start), range.end.min(start + p.n_groups()));
                if lo < hi {
                    // SAFETY: `acts` holds every prepared row; each dst is contiguous F32 with
                    // `rows` rows of its weight's n_rows values, and the handed-out groups'
                    // columns are this thread's alone.
                    unsafe {
                        p.matmul_raw(
                            acts.as_ptr(),
                            arb,
                            rows,
                            dst.ptr as *mut f32,
                            dst.layout.nb[1] / 4,
                            lo - start..hi - start,
                        )
                    };
                }
                start += p.n_groups();
            }
        });
    });
}

/// Groups `range` of both products of a pair (gate, up), then the gated unit's output on
/// their columns of every row: `row(gate, up, out, n)`.
///
/// # Safety
/// `acts` holds `rows` prepared rows of `arb` bytes; both outputs and `out` are contiguous
/// F32 of one shape (`rows` rows of the weights' row count) whose columns in `range × 16` no
/// other thread touches meanwhile; `row` may run here.
unsafe fn glu_pairs(
    parts: &[(&PackedWeight, RawTensor)],
    (acts, arb, rows): (*const u8, usize, usize),
    range: std::ops::Range<usize>,
    row: GluRow,
    out: &RawTensor,
) {
    let [(pg, gate), (pu, up)] = [parts[0], parts[1]];
    let n = pg.shape()[1];
    let stride = out.layout.nb[1] / 4;
    // SAFETY: the caller's contract.
    unsafe {
        pg.matmul_raw(acts, arb, rows, gate.ptr as *mut f32, stride, range.clone());
        pu.matmul_raw(acts, arb, rows, up.ptr as *mut f32, stride, range.clone());
    }
    let cols =
        range.start * crate::packed::GROUP_ROWS..(range.end * crate::packed::GROUP_ROWS).min(n);
    for r in 0..rows {
        let at = r * stride + cols.start;
        // SAFETY: columns `cols` of row r in all three (caller); the row kernel reads each
        // value before writing it, so `out` may be the gate's or the up product's bytes.
        unsafe {
            row(
                (gate.ptr as *const f32).add(at),
                (up.ptr as *const f32).add(at),
                (out.ptr as *mut f32).add(at),
                cols.len(),
            )
        };
    }
}

/// Reference mode: weights dequantized in chunks, activations used as f32 (not quantized),
/// products summed in f64.
fn mul_mat_strict(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (w, x, dst) = (a.src(0), a.src(1), a.dst);
    let k = w.layout.ne[0];
    let [n_out, m, c2, c3] = dst.layout.ne;
    let (r2, r3) = (c2 / w.layout.ne[2], c3 / w.layout.ne[3]);
    let mut buf = [0f32; CHUNK];
    for n in split(n_out, ctx.ith, ctx.nth) {
        for i3 in 0..c3 {
            for i2 in 0..c2 {
                for mi in 0..m {
                    let mut acc = 0f64;
                    let mut c0 = 0;
                    while c0 < k {
                        let len = CHUNK.min(k - c0);
                        // SAFETY: weight row n of batch (i2/r2, i3/r3) exists with contiguous rows.
                        if !unsafe { read_chunk(&w, (n, i2 / r2, i3 / r3), c0, &mut buf[..len]) } {
                            a.errors.record(ERR_KERNEL, 0);
                        }
                        for (j, &wv) in buf[..len].iter().enumerate() {
                            // SAFETY: (c0 + j, mi, i2, i3) is inside x.
                            acc += f64::from(wv)
                                * f64::from(unsafe { x.f32_at([c0 + j, mi, i2, i3]) });
                        }
                        c0 += len;
                    }
                    // SAFETY: element (n, mi, i2, i3) is inside dst; column n is this thread's.
                    unsafe { dst.set_float([n, mi, i2, i3], acc as f32) };
                }
            }
        }
    }
}

/// `dst[i, j, i2, i3] = Σ_k a[i, k, i2/r2, i3/r3] · b[j, k, i2, i3]` (f64 sums in strict mode).
pub(crate) fn out_prod(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, y, dst) = (a.src(0), a.src(1), a.dst);
    let [m, p, c2, c3] = dst.layout.ne;
    let n = x.layout.ne[1];
    let (r2, r3) = (c2 / x.layout.ne[2], c3 / x.layout.ne[3]);
    if !a.strict && gemm_fits(&[&dst, &x, &y]) {
        // dst(j, i) = Σ_k x(i, k) · y(j, k): A = x's rows, B = y by columns.
        return gemm_batches(dst.layout.ne, Some(a), ctx, |i2, i3| Gemm {
            a: strided(&x, (0, i2 / r2, i3 / r3), 1, 0),
            b: strided(&y, (0, i2, i3), 1, 0),
            c: dst.row_f32_ptr(0, i2, i3),
            cm: dst.layout.nb[1] / 4,
            ni: m,
            nm: p,
            nr: n,
            bf16: a.bf16_matmul,
        });
    }
    let rows = split(p * c2 * c3, ctx.ith, ctx.nth);
    if !a.strict && x.layout.rows_contiguous() && dst.layout.rows_contiguous() {
        out_prod_rows(a, rows, m, n, (r2, r3));
        return;
    }
    for r in rows {
        let (j, i2, i3) = row_index(&dst.layout, r);
        for i in 0..m {
            let (mut acc32, mut acc64) = (0f32, 0f64);
            for k in 0..n {
                // SAFETY: (i, k) of a's batch (i2/r2, i3/r3) and (j, k, i2, i3) of b are in bounds.
                let (u, v) =
                    unsafe { (x.f32_at([i, k, i2 / r2, i3 / r3]), y.f32_at([j, k, i2, i3])) };
                if a.strict {
                    acc64 += f64::from(u) * f64::from(v);
                } else {
                    acc32 += u * v;
                }
            }
            let v = if a.strict { acc64 as f32 } else { acc32 };
            // SAFETY: row (j, i2, i3) of dst is this thread's.
            unsafe { dst.set_float([i, j, i2, i3], v) };
        }
    }
}

/// [`out_prod`] over contiguous rows, f32 sums: each destination row is accumulated as
/// `Σ_k b[j, k] · a[:, k]` (a row of `a` at a time, four destination rows per pass over `a`).
/// Every element still adds its products in order k = 0, 1, …, so the result equals the
/// element-by-element loop exactly.
fn out_prod_rows(
    a: &StepArgs<'_>,
    rows: std::ops::Range<usize>,
    m: usize,
    n: usize,
    (r2, r3): (usize, usize),
) {
    const GROUP: usize = 4;
    let (x, y, dst) = (a.src(0), a.src(1), a.dst);
    let mut r = rows.start;
    while r < rows.end {
        let (j0, i2, i3) = row_index(&dst.layout, r);
        // Rows of one (i2, i3) batch, at most GROUP of them.
        let g = GROUP.min(rows.end - r).min(dst.layout.ne[1] - j0);
        let outs: [*mut f32; GROUP] =
            std::array::from_fn(|q| dst.row_f32_ptr(j0 + q.min(g - 1), i2, i3));
        for &o in &outs[..g] {
            // SAFETY: destination rows j0..j0+g of (i2, i3) are this thread's, m values each.
            unsafe { std::slice::from_raw_parts_mut(o, m) }.fill(0.0);
        }
        for k in 0..n {
            // SAFETY: row k of a's batch (i2/r2, i3/r3) exists with contiguous F32 values.
            let xr = unsafe { x.row_f32(k, i2 / r2, i3 / r3) };
            // SAFETY: (j0 + q, k, i2, i3) is inside b for q < g.
            let v: [f32; GROUP] =
                std::array::from_fn(|q| unsafe { y.f32_at([j0 + q.min(g - 1), k, i2, i3]) });
            for (q, &o) in outs[..g].iter().enumerate() {
                // SAFETY: as above; dst never overlaps a or b (an out_prod is not computed in place).
                let out = unsafe { std::slice::from_raw_parts_mut(o, m) };
                for (d, &u) in out.iter_mut().zip(xr) {
                    *d += u * v[q];
                }
            }
        }
        r += g;
    }
}
