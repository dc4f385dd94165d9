//! Gradient kernels of the element-wise, normalization, softmax, row and shape ops. Each result
//! row (or element range) belongs to one thread and every sum runs in a fixed order (in f64),
//! so results are the same on any number of threads.

use tinynn_core::ops::Unary;

use super::elementwise::for_my_elements;
use super::norm::dot64;
use super::{row_index, split, StepArgs, ERR_INDEX, ERR_KERNEL};
use crate::pool::Ctx;

pub(crate) fn fill(v: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    for_my_elements(&a.dst, ctx, |_| v);
}

/// `f'(x)` in f64.
fn derivative(u: Unary, x: f64) -> f64 {
    match u {
        Unary::Silu => {
            let s = 1.0 / (1.0 + (-x).exp());
            s * (1.0 + x * (1.0 - s))
        }
        Unary::GeluTanh => {
            const C: f64 = 0.797_884_560_802_865_4; // sqrt(2/pi)
            let t = (C * (x + 0.044715 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * C * (1.0 + 3.0 * 0.044715 * x * x)
        }
        Unary::GeluErf => {
            let cdf = 0.5 * (1.0 + libm::erf(x * std::f64::consts::FRAC_1_SQRT_2));
            let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
            cdf + x * pdf
        }
        Unary::Tanh => 1.0 - x.tanh().powi(2),
        Unary::Exp => x.exp(),
        Unary::Sqr => 2.0 * x,
        Unary::Sqrt => 0.5 / x.sqrt(),
        Unary::Neg => -1.0,
    }
}

pub(crate) fn unary_back(u: Unary, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, dy) = (a.src(0), a.src(1));
    let rows = |t: &super::RawTensor| t.layout.nb[0] == 4;
    if u == Unary::Silu && !a.strict && rows(&x) && rows(&dy) && rows(&a.dst) {
        // SiLU (SwiGLU's gate), contiguous rows: the same f64 formula, eight lanes at a time.
        for r in split(a.dst.layout.n_rows(), ctx.ith, ctx.nth) {
            let (i1, i2, i3) = row_index(&a.dst.layout, r);
            // SAFETY: row r of each holds ne0 contiguous f32s (same shape, builder-checked);
            // output row r is this thread's; in place, each chunk is read before it is written.
            unsafe {
                crate::simd::vexp::silu_back_row(
                    x.row_f32_ptr(i1, i2, i3),
                    dy.row_f32_ptr(i1, i2, i3),
                    a.dst.row_f32_ptr(i1, i2, i3),
                    a.dst.layout.ne[0],
                )
            };
        }
        return;
    }
    for_my_elements(&a.dst, ctx, |i| {
        // SAFETY: x and dy have the output's shape, F32 (builder-checked); in place over x,
        // element i is read before it is written.
        let (xv, g) = unsafe { (x.f32_at(i), dy.f32_at(i)) };
        (f64::from(g) * derivative(u, f64::from(xv))) as f32
    });
}

/// `Op::SwiGluBack`: dg then du into the flat output, this thread's share of the elements.
pub(crate) fn swiglu_back(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (g, u, dy) = (a.src(0), a.src(1), a.src(2));
    let n = g.layout.n_elements();
    let r = split(n, ctx.ith, ctx.nth);
    let (gp, up, dp) = (
        g.row_f32_ptr(0, 0, 0),
        u.row_f32_ptr(0, 0, 0),
        dy.row_f32_ptr(0, 0, 0),
    );
    let out = a.dst.row_f32_ptr(0, 0, 0);
    // SAFETY: g, u, dy are contiguous F32 of n values and the output holds 2n (builder-checked);
    // elements r of each part are this thread's.
    unsafe {
        crate::simd::vexp::swiglu_back_row(
            gp.add(r.start),
            up.add(r.start),
            dp.add(r.start),
            out.add(r.start),
            out.add(n + r.start),
            r.len(),
            a.strict,
        )
    };
}

pub(crate) fn reduce_to(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let (nd, nx) = (a.dst.layout.ne, x.layout.ne);
    let reps = [nx[0] / nd[0], nx[1] / nd[1], nx[2] / nd[2], nx[3] / nd[3]];
    let f32_rows = x.layout.dtype == tinynn_format::GgmlType::F32 && x.layout.nb[0] == 4;
    if nd[1] * nd[2] * nd[3] == 1 && reps[0] == 1 && f32_rows {
        // Sums over whole rows into one row (bias and norm-weight gradients): the row's
        // elements split over the threads, 64 sums at a time added row by row, each in the
        // order below.
        const W: usize = 64;
        let out = a.dst.ptr as *mut f32;
        let mine = split(nd[0], ctx.ith, ctx.nth);
        let mut j0 = mine.start;
        while j0 < mine.end {
            let w = W.min(mine.end - j0);
            let mut acc = [0f64; W];
            for k3 in 0..nx[3] {
                for k2 in 0..nx[2] {
                    for k1 in 0..nx[1] {
                        // SAFETY: row (k1, k2, k3) of x holds nx0 = nd0 contiguous f32s.
                        let row = unsafe { x.row_f32(k1, k2, k3) };
                        for (s, &v) in acc[..w].iter_mut().zip(&row[j0..j0 + w]) {
                            *s += f64::from(v);
                        }
                    }
                }
            }
            for (c, &s) in acc[..w].iter().enumerate() {
                // SAFETY: element j0 + c of the contiguous F32 output is this thread's.
                unsafe { out.add(j0 + c).write(s as f32) };
            }
            j0 += w;
        }
        return;
    }
    for_my_elements(&a.dst, ctx, |j| {
        let mut acc = 0f64;
        for k3 in 0..reps[3] {
            for k2 in 0..reps[2] {
                for k1 in 0..reps[1] {
                    for k0 in 0..reps[0] {
                        let i = [
                            j[0] + k0 * nd[0],
                            j[1] + k1 * nd[1],
                            j[2] + k2 * nd[2],
                            j[3] + k3 * nd[3],
                        ];
                        // SAFETY: i_d = j_d + k·nd_d < nx_d.
                        acc += f64::from(unsafe { x.f32_at(i) });
                    }
                }
            }
        }
        acc as f32
    });
}

pub(crate) fn repeat(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let n = x.layout.ne;
    // SAFETY: indices reduced modulo x's shape.
    for_my_elements(&a.dst, ctx, |i| unsafe {
        x.f32_at([i[0] % n[0], i[1] % n[1], i[2] % n[2], i[3] % n[3]])
    });
}

/// Runs `f(x_row, dy_row, out_row)` on this thread's rows (contiguous F32 rows, builder-checked;
/// the output never aliases the inputs for these ops).
fn for_my_rows(a: &StepArgs<'_>, ctx: &Ctx<'_>, f: impl Fn(&[f32], &[f32], &mut [f32])) {
    let (x, dy) = (a.src(0), a.src(1));
    for r in split(a.dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&a.dst.layout, r);
        // SAFETY: row r exists in all three (same shapes) and is this thread's output row.
        let (xr, gr, out) = unsafe {
            (
                x.row_f32(i1, i2, i3),
                dy.row_f32(i1, i2, i3),
                a.dst.row_f32_mut(i1, i2, i3),
            )
        };
        f(xr, gr, out);
    }
}

/// `dx = r·dy − r³·x·mean(x·dy)` with `r = 1/sqrt(mean(x²) + eps)`.
pub(crate) fn rms_norm_back(eps: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    for_my_rows(a, ctx, |x, g, out| {
        let n = x.len() as f64;
        let r = 1.0 / (dot64(x, x) / n + f64::from(eps)).sqrt();
        let c = r * r * r * dot64(x, g) / n;
        for ((o, &xv), &gv) in out.iter_mut().zip(x).zip(g) {
            *o = (r * f64::from(gv) - c * f64::from(xv)) as f32;
        }
    });
}

/// `dx = (g − mean(g) − x̂·mean(g·x̂)) / σ` with `x̂ = (x − μ)/σ`.
pub(crate) fn layer_norm_back(eps: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    for_my_rows(a, ctx, |x, g, out| {
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let var = x
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        let inv = 1.0 / (var + f64::from(eps)).sqrt();
        let g_mean = g.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let gx_mean = x
            .iter()
            .zip(g)
            .map(|(&xv, &gv)| (f64::from(xv) - mean) * inv * f64::from(gv))
            .sum::<f64>()
            / n;
        for ((o, &xv), &gv) in out.iter_mut().zip(x).zip(g) {
            let xhat = (f64::from(xv) - mean) * inv;
            *o = ((f64::from(gv) - g_mean - xhat * gx_mean) * inv) as f32;
        }
    });
}

/// `dx = scale · y · (dy − Σ y·dy)`.
pub(crate) fn soft_max_back(scale: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    for_my_rows(a, ctx, |y, g, out| {
        let s = dot64(y, g);
        for ((o, &yv), &gv) in out.iter_mut().zip(y).zip(g) {
            *o = (f64::from(scale) * f64::from(yv) * (f64::from(gv) - s)) as f32;
        }
    });
}

pub(crate) fn diag_mask_zero(n_past: usize, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    for_my_elements(&a.dst, ctx, |i| {
        if i[0] > n_past + i[1] {
            0.0
        } else {
            // SAFETY: same shape as the output.
            unsafe { x.f32_at(i) }
        }
    });
}

pub(crate) fn get_rows_back(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (dy, idx, dst) = (a.src(0), a.src(1), a.dst);
    // SAFETY: indices are contiguous I32 [n] (builder-checked).
    let indices = unsafe { idx.i32s() };
    let n_rows = dst.layout.ne[1];
    let mine = split(n_rows, ctx.ith, ctx.nth);
    for r in mine.clone() {
        // SAFETY: row r of the output is this thread's.
        unsafe { dst.row_f32_mut(r, 0, 0) }.fill(0.0);
    }
    for (n, &r) in indices.iter().enumerate() {
        if r < 0 || r as usize >= n_rows {
            if ctx.ith == 0 {
                a.errors.record(ERR_INDEX, r as u32);
            }
            continue;
        }
        if !mine.contains(&(r as usize)) {
            continue;
        }
        // SAFETY: row r is this thread's; row n of dy exists (contiguous rows).
        let (out, g) = unsafe { (dst.row_f32_mut(r as usize, 0, 0), dy.row_f32(n, 0, 0)) };
        for (o, &v) in out.iter_mut().zip(g) {
            *o += v;
        }
    }
}

pub(crate) fn cross_entropy_loss_back(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (logits, labels_t, dl) = (a.src(0), a.src(1), a.src(2));
    // SAFETY: labels are contiguous I32 [rows]; dl is F32 [1] (builder-checked).
    let (labels, dl) = unsafe { (labels_t.i32s(), dl.f32_at([0; 4])) };
    let v = logits.layout.ne[0];
    let valid = |l: i32| l >= 0 && (l as usize) < v;
    let count = match a.src.get(3).copied().flatten() {
        // SAFETY: the divisor is F32 [1] (builder-checked).
        Some(norm) => f64::from(unsafe { norm.f32_at([0; 4]) }),
        None => labels.iter().filter(|&&l| valid(l)).count() as f64,
    };
    let k = if count > 0.0 {
        f64::from(dl) / count
    } else {
        0.0
    };
    for r in split(labels.len(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&logits.layout, r);
        // SAFETY: contiguous F32 rows of the same shape; output row r is this thread's.
        let (row, out) = unsafe { (logits.row_f32(i1, i2, i3), a.dst.row_f32_mut(i1, i2, i3)) };
        let label = labels[r];
        if !valid(label) {
            out.fill(0.0);
            continue;
        }
        let max = crate::simd::vexp::row_max(row);
        if a.strict {
            let sum: f64 = row.iter().map(|&x| f64::from(x - max).exp()).sum();
            for (j, (o, &x)) in out.iter_mut().zip(row).enumerate() {
                let p = f64::from(x - max).exp() / sum;
                let t = if j == label as usize { 1.0 } else { 0.0 };
                *o = (k * (p - t)) as f32;
            }
            continue;
        }
        // The same sums, vectorized: k·p everywhere, then the label's k·(p − 1).
        let sum = crate::simd::vexp::sum_exp_f64(row, max);
        crate::simd::vexp::softmax_scaled_row(row, max, sum, k, out);
        let p = f64::from(row[label as usize] - max).exp() / sum;
        out[label as usize] = (k * (p - 1.0)) as f32;
    }
}

/// Splits byte offset `b` into the element index of a tensor with shape `ne` and nested byte
/// strides `nb` (dimensions visited from the largest stride down).
fn decompose(mut b: usize, ne: [usize; 4], nb: [usize; 4], order: [usize; 4]) -> Option<usize> {
    let mut j = [0usize; 4];
    for &d in &order {
        if ne[d] > 1 {
            j[d] = b / nb[d];
            b -= j[d] * nb[d];
            if j[d] >= ne[d] {
                return None;
            }
        }
    }
    (b == 0).then(|| j[0] + ne[0] * (j[1] + ne[1] * (j[2] + ne[2] * j[3])))
}

pub(crate) fn view_back(
    offset: usize,
    nb: [usize; 4],
    src_nb: [usize; 4],
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (dy, dst) = (a.src(0), a.dst);
    let ne_s = dst.layout.ne;
    let mut order = [0, 1, 2, 3];
    order.sort_by_key(|&d| std::cmp::Reverse(src_nb[d]));
    let mine = split(dst.layout.n_elements(), ctx.ith, ctx.nth);
    let out = dst.ptr as *mut f32;
    for e in mine.clone() {
        // SAFETY: the output is contiguous F32; elements in `mine` are this thread's.
        unsafe { out.add(e).write(0.0) };
    }
    // Element i of dy added into the output element it views (if this thread's).
    let one = |i: [usize; 4]| {
        let b = offset + i[0] * nb[0] + i[1] * nb[1] + i[2] * nb[2] + i[3] * nb[3];
        let Some(e) = decompose(b, ne_s, src_nb, order) else {
            if ctx.ith == 0 {
                a.errors.record(ERR_KERNEL, 0);
            }
            return;
        };
        if mine.contains(&e) {
            // SAFETY: i is inside dy; element e of the output is this thread's, and only this
            // thread adds into it, in dy's order.
            unsafe { out.add(e).write(out.add(e).read() + dy.f32_at(i)) };
        }
    };
    let nv = dy.layout.ne;
    if nb[0] == 4 && src_nb[0] == 4 && dy.layout.nb[0] == 4 {
        // Rows of the view run along rows of the source: one decomposition per row, then
        // the row added element by element (the same elements in the same order as below).
        for i3 in 0..nv[3] {
            for i2 in 0..nv[2] {
                for i1 in 0..nv[1] {
                    let b = offset + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                    let e0 = decompose(b, ne_s, src_nb, order);
                    let Some(e0) = e0.filter(|e| e % ne_s[0] + nv[0] <= ne_s[0]) else {
                        // The row crosses rows of the source (or leaves it): element-wise.
                        for i0 in 0..nv[0] {
                            one([i0, i1, i2, i3]);
                        }
                        continue;
                    };
                    let (lo, hi) = (e0.max(mine.start), (e0 + nv[0]).min(mine.end));
                    let row = dy.row_f32_ptr(i1, i2, i3);
                    for e in lo..hi {
                        // SAFETY: element e − e0 < ne0 of dy's row (i1, i2, i3); element e
                        // of the output is this thread's.
                        unsafe { out.add(e).write(out.add(e).read() + *row.add(e - e0)) };
                    }
                }
            }
        }
        return;
    }
    for i3 in 0..nv[3] {
        for i2 in 0..nv[2] {
            for i1 in 0..nv[1] {
                for i0 in 0..nv[0] {
                    one([i0, i1, i2, i3]);
                }
            }
        }
    }
}
