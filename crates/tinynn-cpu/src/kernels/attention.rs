//! Fused attention (online softmax over the kv rows, one query row and head at a time) and
//! causal masking.

use super::{row_index, split, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;

/// Largest head size kept on the stack (the builder enforces it).
const MAX_D: usize = 512;

pub(crate) fn flash_attn(
    scale: f32,
    softcap: f32,
    has_mask: bool,
    has_kv_len: bool,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let (q, k, v) = (a.src(0), a.src(1), a.src(2));
    let mut next = 3;
    let mask = has_mask.then(|| {
        next += 1;
        a.src(next - 1)
    });
    let n_kv_all = k.layout.ne[1];
    let n_kv = if has_kv_len {
        // SAFETY: an I32 [1] tensor (builder-checked).
        let n = unsafe { a.src(next).i32s() }[0];
        if n < 0 || n as usize > n_kv_all {
            a.errors.record(ERR_KERNEL, 0);
            return;
        }
        n as usize
    } else {
        n_kv_all
    };
    let (d, n_q, n_head) = (q.layout.ne[0], q.layout.ne[1], q.layout.ne[2]);
    let dv = v.layout.ne[0];
    let group = n_head / k.layout.ne[2];
    let (mut qbuf, mut acc) = ([0f32; MAX_D], [0f32; MAX_D]);
    for job in split(n_q * n_head, ctx.ith, ctx.nth) {
        let (h, i) = (job % n_head, job / n_head);
        let hk = h / group;
        for (j, x) in qbuf[..d].iter_mut().enumerate() {
            // SAFETY: (j, i, h) is inside q.
            *x = unsafe { q.f32_at([j, i, h, 0]) };
        }
        acc[..dv].fill(0.0);
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
        for j in 0..n_kv {
            let mut s = 0f32;
            for (c, &qc) in qbuf[..d].iter().enumerate() {
                // SAFETY: (c, j, hk) is inside k (j < n_kv ≤ ne1, hk < H_kv).
                s += qc * unsafe { k.float_at([c, j, hk, 0]) };
            }
            s *= scale;
            if softcap > 0.0 {
                s = softcap * (s / softcap).tanh();
            }
            if let Some(m) = mask {
                // SAFETY: the mask is [n_kv, ≥ n_q] (builder-checked).
                s += unsafe { m.f32_at([j, i, 0, 0]) };
            }
            if s == f32::NEG_INFINITY {
                continue;
            }
            let weight = if s > max {
                let shrink = (max - s).exp();
                acc[..dv].iter_mut().for_each(|x| *x *= shrink);
                sum *= shrink;
                max = s;
                1.0
            } else {
                (s - max).exp()
            };
            for (c, x) in acc[..dv].iter_mut().enumerate() {
                // SAFETY: (c, j, hk) is inside v.
                *x += weight * unsafe { v.float_at([c, j, hk, 0]) };
            }
            sum += weight;
        }
        let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
        let out = a.dst.row_f32_ptr(h, i, 0);
        for (c, &x) in acc[..dv].iter().enumerate() {
            // SAFETY: output row (h, i) is [Dv] contiguous and this thread's.
            unsafe { out.add(c).write(x * inv) };
        }
    }
}

pub(crate) fn diag_mask_inf(n_past: usize, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let dst = a.dst;
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        let (inp, out) = (x.row_f32_ptr(i1, i2, i3), dst.row_f32_ptr(i1, i2, i3));
        for i0 in 0..dst.layout.ne[0] {
            // SAFETY: i0 < ne0 in both rows (contiguous F32, builder-checked); this thread's row;
            // in place, each element is read before it is written.
            unsafe {
                let v = if i0 > n_past + i1 {
                    f32::NEG_INFINITY
                } else {
                    inp.add(i0).read()
                };
                out.add(i0).write(v);
            }
        }
    }
}
