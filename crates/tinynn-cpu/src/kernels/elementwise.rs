//! Element-wise kernels: unary functions, broadcasting binary ops, scale, SwiGLU.
//! Outputs are contiguous F32; inputs may have any strides.

use tinynn_core::ops::{Binary, Op, Unary};

use super::{row_index, split, RawTensor, StepArgs};
use crate::pool::Ctx;

#[inline]
pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh())
}

#[inline]
fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline]
fn apply_unary(u: Unary, x: f32) -> f32 {
    match u {
        Unary::Silu => silu(x),
        Unary::GeluTanh => gelu_tanh(x),
        Unary::GeluErf => gelu_erf(x),
        Unary::Tanh => x.tanh(),
        Unary::Exp => x.exp(),
        Unary::Sqr => x * x,
        Unary::Sqrt => x.sqrt(),
        Unary::Neg => -x,
    }
}

/// For each element of this thread's output rows, stores `f(i0, i1, i2, i3)`. The output may
/// be the first input (in place): each element is read by `f` just before it is written.
#[inline]
pub(crate) fn for_my_elements(dst: &RawTensor, ctx: &Ctx<'_>, f: impl Fn([usize; 4]) -> f32) {
    let ne0 = dst.layout.ne[0];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        let out = dst.row_f32_ptr(i1, i2, i3);
        for i0 in 0..ne0 {
            let v = f([i0, i1, i2, i3]);
            // SAFETY: the output is contiguous F32 and row r belongs to this thread.
            unsafe { out.add(i0).write(v) };
        }
    }
}

/// For each of this thread's output rows, `f(input row, output row, n)` when the input has
/// contiguous F32 rows (rows of the output's shape); `false` (nothing done) otherwise.
fn by_rows(
    x: &RawTensor,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
    f: impl Fn(*const f32, *mut f32, usize),
) -> bool {
    if x.layout.nb[0] != 4 || x.layout.dtype != tinynn_format::GgmlType::F32 {
        return false;
    }
    let dst = &a.dst;
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        f(
            x.row_f32_ptr(i1, i2, i3),
            dst.row_f32_ptr(i1, i2, i3),
            dst.layout.ne[0],
        );
    }
    true
}

pub(crate) fn unary(u: Unary, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let rows = by_rows(&x, a, ctx, |xp, out, n| {
        for i in 0..n {
            // SAFETY: rows of n contiguous F32 values (x has the output's shape); this thread's
            // row; in place, each value is read before it is written.
            unsafe { out.add(i).write(apply_unary(u, xp.add(i).read())) };
        }
    });
    if !rows {
        // SAFETY: same shape as the output, F32 (builder-checked).
        for_my_elements(&a.dst, ctx, |i| apply_unary(u, unsafe { x.f32_at(i) }));
    }
}

pub(crate) fn scale(s: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let rows = by_rows(&x, a, ctx, |xp, out, n| {
        for i in 0..n {
            // SAFETY: as in `unary`.
            unsafe { out.add(i).write(xp.add(i).read() * s) };
        }
    });
    if !rows {
        // SAFETY: same shape as the output, F32.
        for_my_elements(&a.dst, ctx, |i| unsafe { x.f32_at(i) } * s);
    }
}

pub(crate) fn binary(op: Binary, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, y) = (a.src(0), a.src(1));
    let ny = y.layout.ne;
    let dst = &a.dst;
    if x.layout.nb[0] == 4 && y.layout.nb[0] == 4 && ny[0] == dst.layout.ne[0] {
        // Whole rows per thread, even for one row: `executor/groups.rs` chains row-wise steps
        // without barriers on that (a thread reads only rows it wrote).
        for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
            let (i1, i2, i3) = row_index(&dst.layout, r);
            let (xp, yp, out) = (
                x.row_f32_ptr(i1, i2, i3),
                y.row_f32_ptr(i1 % ny[1], i2 % ny[2], i3 % ny[3]),
                dst.row_f32_ptr(i1, i2, i3),
            );
            // SAFETY: rows of ne0 contiguous F32 values (x has the output's shape, y's row
            // index is reduced modulo its shape); row r is this thread's; in place, each
            // value is read before it is written.
            unsafe { binary_row(op, xp, yp, out, dst.layout.ne[0]) };
        }
        return;
    }
    for_my_elements(&a.dst, ctx, |i| {
        let j = [i[0] % ny[0], i[1] % ny[1], i[2] % ny[2], i[3] % ny[3]];
        // SAFETY: x has the output's shape; y's indices are reduced modulo its shape.
        let (p, q) = unsafe { (x.f32_at(i), y.f32_at(j)) };
        match op {
            Binary::Add => p + q,
            Binary::Sub => p - q,
            Binary::Mul => p * q,
            Binary::Div => p / q,
        }
    });
}

/// One row of a binary op on contiguous values.
///
/// # Safety
/// `x`, `y`, `out` point to `n` f32s; `out` may equal `x` or `y`.
unsafe fn binary_row(op: Binary, x: *const f32, y: *const f32, out: *mut f32, n: usize) {
    // SAFETY: as this function's.
    unsafe {
        match op {
            Binary::Add => each_pair(x, y, out, n, |p, q| p + q),
            Binary::Sub => each_pair(x, y, out, n, |p, q| p - q),
            Binary::Mul => each_pair(x, y, out, n, |p, q| p * q),
            Binary::Div => each_pair(x, y, out, n, |p, q| p / q),
        }
    }
}

/// Where an output row of `n` values lies against an input row.
#[derive(Clone, Copy, PartialEq)]
enum Overlap {
    Same,
    Apart,
    Partly,
}

fn overlap(out: *const f32, input: *const f32, n: usize) -> Overlap {
    let (o, i) = (out as usize, input as usize);
    if o == i {
        Overlap::Same
    } else if o + 4 * n <= i || i + 4 * n <= o {
        Overlap::Apart
    } else {
        Overlap::Partly
    }
}

/// `out[i] = f(x[i], y[i])`, through slices where the rows are the same or apart (so the loop
/// vectorizes: a decode token's norm weight comes from memory, and a scalar loop waits on one
/// load at a time), else element by element.
///
/// # Safety
/// `x`, `y`, `out` point to `n` f32s.
#[inline(always)]
pub(super) unsafe fn each_pair(
    x: *const f32,
    y: *const f32,
    out: *mut f32,
    n: usize,
    f: impl Fn(f32, f32) -> f32,
) {
    use std::slice::{from_raw_parts, from_raw_parts_mut};
    // SAFETY (every arm): the rows hold n f32s (caller); a mutable slice of `out` is made only
    // when no shared slice overlaps it, and an input equal to `out` is read through it.
    unsafe {
        match (overlap(out, x, n), overlap(out, y, n)) {
            (Overlap::Same, Overlap::Same) => {
                from_raw_parts_mut(out, n)
                    .iter_mut()
                    .for_each(|v| *v = f(*v, *v));
            }
            (Overlap::Same, Overlap::Apart) => {
                let o = from_raw_parts_mut(out, n);
                for (v, &q) in o.iter_mut().zip(from_raw_parts(y, n)) {
                    *v = f(*v, q);
                }
            }
            (Overlap::Apart, Overlap::Same) => {
                let o = from_raw_parts_mut(out, n);
                for (v, &p) in o.iter_mut().zip(from_raw_parts(x, n)) {
                    *v = f(p, *v);
                }
            }
            (Overlap::Apart, Overlap::Apart) => {
                let o = from_raw_parts_mut(out, n);
                let (xs, ys) = (from_raw_parts(x, n), from_raw_parts(y, n));
                for ((v, &p), &q) in o.iter_mut().zip(xs).zip(ys) {
                    *v = f(p, q);
                }
            }
            _ => {
                for i in 0..n {
                    out.add(i).write(f(x.add(i).read(), y.add(i).read()));
                }
            }
        }
    }
}

/// A gated activation `out = act(g)·u` over rows with contiguous F32 values: `row(g, u, out,
/// n)` on this thread's rows. False (nothing done) when a source's rows are strided.
fn glu_rows(a: &StepArgs<'_>, ctx: &Ctx<'_>, row: GluRow) -> bool {
    let (g, u, dst) = (a.src(0), a.src(1), &a.dst);
    if g.layout.nb[0] != 4 || u.layout.nb[0] != 4 {
        return false;
    }
    let (n_rows, n) = (dst.layout.n_rows(), dst.layout.ne[0]);
    // Fewer rows than threads (decode's one row): each thread takes a share of every row's
    // values, cut at multiples of 16 (whole vectors; the vector and one-value paths give the
    // same bits anyway). A thread mostly reads values its share of the gate and up products
    // wrote.
    let (rows, cols) = if n_rows < ctx.nth {
        let per = n.div_ceil(ctx.nth).next_multiple_of(16);
        let start = (ctx.ith * per).min(n);
        (0..n_rows, start..(start + per).min(n))
    } else {
        (split(n_rows, ctx.ith, ctx.nth), 0..n)
    };
    for r in rows {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        // SAFETY: all three have the output's shape with contiguous F32 rows; values `cols`
        // of row r are this thread's; in place, each value is read before it is written.
        unsafe {
            row(
                g.row_f32_ptr(i1, i2, i3).add(cols.start),
                u.row_f32_ptr(i1, i2, i3).add(cols.start),
                dst.row_f32_ptr(i1, i2, i3).add(cols.start),
                cols.len(),
            )
        };
    }
    true
}

/// A gated unit's row kernel (SwiGLU, GeGLU): what its step runs on whole rows and what the
/// gate/up products' epilogue runs on their columns (`matmul::glu_pairs`), so both give the
/// same bits.
pub(crate) type GluRow = unsafe fn(*const f32, *const f32, *mut f32, usize);

/// The row kernel of gated-unit op `op` (None for any other op).
pub(crate) fn glu_row(op: Op) -> Option<GluRow> {
    match op {
        Op::SwiGlu => Some(crate::simd::vexp::swiglu_row),
        Op::GeGlu => Some(crate::simd::vexp::geglu_row),
        _ => None,
    }
}

pub(crate) fn geglu(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    if !a.strict && glu_rows(a, ctx, crate::simd::vexp::geglu_row) {
        return;
    }
    let (g, u) = (a.src(0), a.src(1));
    // SAFETY: both sources have the output's shape, F32.
    for_my_elements(&a.dst, ctx, |i| unsafe {
        gelu_tanh(g.f32_at(i)) * u.f32_at(i)
    });
}

pub(crate) fn swiglu(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    if glu_rows(a, ctx, crate::simd::vexp::swiglu_row) {
        return;
    }
    let (g, u) = (a.src(0), a.src(1));
    // SAFETY: both sources have the output's shape, F32.
    for_my_elements(&a.dst, ctx, |i| unsafe { silu(g.f32_at(i)) * u.f32_at(i) });
}

#[cfg(test)]
mod tests {
    use super::binary_row;
    use tinynn_core::ops::Binary;

    /// Every way an output row can lie against its inputs (apart, in place over either or
    /// both, partly overlapping) gives what an element-by-element loop gives.
    #[test]
    fn binary_rows_in_place_apart_and_overlapping() {
        let n = 37;
        let base: Vec<f32> = (0..3 * n).map(|i| (i as f32 * 0.37).sin() + 1.5).collect();
        // (x, y, out) as offsets into one buffer.
        let cases = [
            (0, n, 2 * n),
            (0, n, 0),
            (0, n, n),
            (0, 0, 0),
            (0, n, 3),
            (5, n, 0),
        ];
        for op in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
            for (xo, yo, oo) in cases {
                let mut want = base.clone();
                for i in 0..n {
                    let (p, q) = (want[xo + i], want[yo + i]);
                    want[oo + i] = match op {
                        Binary::Add => p + q,
                        Binary::Sub => p - q,
                        Binary::Mul => p * q,
                        Binary::Div => p / q,
                    };
                }
                let mut got = base.clone();
                let ptr = got.as_mut_ptr();
                // SAFETY: the three rows of n values lie inside the 3n-value buffer.
                unsafe { binary_row(op, ptr.add(xo), ptr.add(yo), ptr.add(oo), n) };
                assert_eq!(got, want, "{op:?} x {xo} y {yo} out {oo}");
            }
        }
    }
}
