//! Training kernels: cross-entropy loss with a label mask, and the AdamW and SGD steps
//! (element-wise, in place on persistent tensors, hyperparameters read at run time).

use super::{split, StepArgs};
use crate::pool::Ctx;
#[cfg(target_arch = "x86_64")]
use crate::simd::lanes16::{Lanes16, Pair, Wide};

/// Most threads whose partial sums fit the planned work buffer.
const MAX_PARTIALS: usize = 64;

pub(crate) fn cross_entropy_loss(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (logits, labels_t) = (a.src(0), a.src(1));
    // SAFETY: labels are contiguous I32 [rows] (builder-checked).
    let labels = unsafe { labels_t.i32s() };
    let v = logits.layout.ne[0];
    let (ith, nth) = if ctx.nth <= MAX_PARTIALS {
        (ctx.ith, ctx.nth)
    } else {
        (ctx.ith, 1)
    };
    let (mut loss, mut count) = (0f64, 0f64);
    if ith < nth {
        for r in split(labels.len(), ith, nth) {
            let label = labels[r];
            if label < 0 || label as usize >= v {
                continue;
            }
            let (i1, i2, i3) = super::row_index(&logits.layout, r);
            // SAFETY: contiguous F32 rows (builder-checked).
            let row = unsafe { logits.row_f32(i1, i2, i3) };
            let max = crate::simd::vexp::row_max(row);
            let sum: f64 = if a.strict {
                row.iter().map(|&x| f64::from(x - max).exp()).sum()
            } else {
                crate::simd::vexp::sum_exp_f64(row, max)
            };
            loss += sum.ln() - f64::from(row[label as usize] - max);
            count += 1.0;
        }
    }
    let partials = a.work as *mut f64;
    if ith < nth {
        // SAFETY: the work buffer holds MAX_PARTIALS (loss, count) pairs; slot ith is this thread's.
        unsafe {
            partials.add(2 * ith).write(loss);
            partials.add(2 * ith + 1).write(count);
        }
    }
    if ctx.barrier().is_err() {
        return;
    }
    if ctx.ith == 0 {
        let (mut total, mut n) = (0f64, 0f64);
        for t in 0..nth {
            // SAFETY: written by thread t before the barrier.
            unsafe {
                total += partials.add(2 * t).read();
                n += partials.add(2 * t + 1).read();
            }
        }
        // A divisor operand replaces the count (a chunk's share of a larger batch's mean).
        let n = match a.src.get(2).copied().flatten() {
            // SAFETY: the divisor is F32 [1] (builder-checked).
            Some(norm) => f64::from(unsafe { norm.f32_at([0; 4]) }),
            None => n,
        };
        let mean = if n > 0.0 { total / n } else { 0.0 };
        // SAFETY: the [1] output, written by thread 0 only.
        unsafe { a.dst.row_f32_ptr(0, 0, 0).write(mean as f32) };
    }
}

/// Inverted dropout (`Op::Dropout`): the mask of each element from its flat output index.
pub(crate) fn dropout(p: f32, salt: u32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (x, seed_t) = (a.src(0), a.src(1));
    // SAFETY: the seed is contiguous I32 [2] (builder-checked).
    let words = unsafe { seed_t.i32s() };
    let seed = u64::from(words[0] as u32) | (u64::from(words[1] as u32) << 32);
    let ne = a.dst.layout.ne;
    if x.layout.nb[0] == 4 {
        for r in split(a.dst.layout.n_rows(), ctx.ith, ctx.nth) {
            let (i1, i2, i3) = super::row_index(&a.dst.layout, r);
            // SAFETY: rows of ne0 F32 values in both (same shape, unit stride); output row r is
            // this thread's; dropout never runs in place (`Op::can_run_in_place`), so the two
            // rows do not overlap.
            let (src, out) = unsafe {
                (
                    std::slice::from_raw_parts(x.row_f32_ptr(i1, i2, i3), ne[0]),
                    std::slice::from_raw_parts_mut(a.dst.row_f32_ptr(i1, i2, i3), ne[0]),
                )
            };
            let first = (r * ne[0]) as u64;
            crate::simd::dropout::dropout_run(src, out, seed, salt, first, p);
        }
        return;
    }
    let keep = 1.0 / (1.0 - p);
    super::elementwise::for_my_elements(&a.dst, ctx, |i| {
        let flat = i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]));
        if tinynn_core::ops::dropout_drops(seed, salt, flat as u64, p) {
            0.0
        } else {
            // SAFETY: same shape as the output, F32 (builder-checked).
            unsafe { x.f32_at(i) * keep }
        }
    });
}

/// The optional gradient factor at index `n` of the hyperparameters (source `src`), 1 if absent.
fn grad_scale(a: &StepArgs<'_>, src: usize, n: usize) -> f32 {
    if a.src(src).layout.ne[0] > n {
        hp(a, src, n)
    } else {
        1.0
    }
}

/// The n-th hyperparameter.
fn hp(a: &StepArgs<'_>, src: usize, n: usize) -> f32 {
    // SAFETY: hyperparameters are an F32 [7] / [3] tensor (builder-checked), n within it.
    unsafe { a.src(src).f32_at([n, 0, 0, 0]) }
}

pub(crate) fn adamw(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let [lr, beta1, beta2, eps, wd, beta1h, beta2h] = std::array::from_fn(|i| hp(a, 4, i));
    let scale = grad_scale(a, 4, 7);
    let (w, g, m, v) = (
        a.dst.row_f32_ptr(0, 0, 0),
        a.src(1).row_f32_ptr(0, 0, 0),
        a.src(2).row_f32_ptr(0, 0, 0),
        a.src(3).row_f32_ptr(0, 0, 0),
    );
    let keep = 1.0 - lr * wd;
    let mut mine = split(a.dst.layout.n_elements(), ctx.ith, ctx.nth);
    #[cfg(target_arch = "x86_64")]
    if crate::simd::vexp::available() {
        let h = AdamHp {
            beta1,
            beta2,
            beta1h,
            beta2h,
            eps,
            lr,
            keep,
            scale,
        };
        // SAFETY: AVX-512F checked; as below for the elements of `mine`.
        let done = unsafe { adamw_avx512(&h, [w, g, m, v], mine.clone()) };
        mine.start = done;
    } else if crate::simd::Isa::detected() >= crate::simd::Isa::Avx2 {
        let h = AdamHp {
            beta1,
            beta2,
            beta1h,
            beta2h,
            eps,
            lr,
            keep,
            scale,
        };
        // SAFETY: AVX2 checked; as below for the elements of `mine`.
        let done = unsafe { adamw_avx2(&h, [w, g, m, v], mine.clone()) };
        mine.start = done;
    }
    for i in mine {
        // SAFETY: all four tensors are contiguous F32 of the parameter's size; element i is
        // this thread's, in each.
        unsafe {
            let gi = g.add(i).read() * scale;
            let mi = m.add(i).read() * beta1 + gi * (1.0 - beta1);
            let vi = v.add(i).read() * beta2 + gi * gi * (1.0 - beta2);
            m.add(i).write(mi);
            v.add(i).write(vi);
            let step = (mi * beta1h) / ((vi * beta2h).sqrt() + eps);
            w.add(i).write(w.add(i).read() * keep - lr * step);
        }
    }
}

/// AdamW's hyperparameters as the kernel uses them.
#[cfg(target_arch = "x86_64")]
struct AdamHp {
    beta1: f32,
    beta2: f32,
    beta1h: f32,
    beta2h: f32,
    eps: f32,
    lr: f32,
    keep: f32,
    /// The gradient's factor (clipping).
    scale: f32,
}

/// [`adamw`]'s loop over whole 16-value chunks of `range`, the same f32 operations in the same
/// order (no fused multiply-adds), so the results are bit-identical; returns where it stopped.
/// Written once over [`Lanes16`]: one AVX-512 register or two AVX2 ones.
///
/// # Safety
/// `S`'s instruction set; `[w, g, m, v]` are distinct F32 tensors holding every element of
/// `range`, which belongs to this thread.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn adamw_lanes<S: Lanes16>(
    h: &AdamHp,
    [w, g, m, v]: [*mut f32; 4],
    range: std::ops::Range<usize>,
) -> usize {
    // SAFETY (every block below): S's instruction set (caller).
    let s = |x: f32| unsafe { S::splat(x) };
    let (b1, b1c, b2, b2c) = (s(h.beta1), s(1.0 - h.beta1), s(h.beta2), s(1.0 - h.beta2));
    let (b1h, b2h, eps, lr, keep) = (s(h.beta1h), s(h.beta2h), s(h.eps), s(h.lr), s(h.keep));
    let scale = s(h.scale);
    let mut i = range.start;
    while i + 16 <= range.end {
        // SAFETY: elements i..i+16 of each tensor (caller).
        unsafe {
            let gi = S::mul(S::load(g.add(i)), scale);
            let mi = S::add(S::mul(S::load(m.add(i)), b1), S::mul(gi, b1c));
            let vi = S::add(S::mul(S::load(v.add(i)), b2), S::mul(S::mul(gi, gi), b2c));
            S::store(m.add(i), mi);
            S::store(v.add(i), vi);
            let step = S::div(S::mul(mi, b1h), S::add(S::sqrt(S::mul(vi, b2h)), eps));
            let wi = S::sub(S::mul(S::load(w.add(i)), keep), S::mul(lr, step));
            S::store(w.add(i), wi);
        }
        i += 16;
    }
    i
}

/// [`adamw_lanes`] compiled for AVX-512.
///
/// # Safety
/// AVX-512F; as [`adamw_lanes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn adamw_avx512(h: &AdamHp, t: [*mut f32; 4], range: std::ops::Range<usize>) -> usize {
    // SAFETY: the caller's contract.
    unsafe { adamw_lanes::<Wide>(h, t, range) }
}

/// [`adamw_lanes`] compiled for AVX2.
///
/// # Safety
/// AVX2; as [`adamw_lanes`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn adamw_avx2(h: &AdamHp, t: [*mut f32; 4], range: std::ops::Range<usize>) -> usize {
    // SAFETY: the caller's contract.
    unsafe { adamw_lanes::<Pair>(h, t, range) }
}

pub(crate) fn sgd(a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let [lr, momentum, wd] = std::array::from_fn(|i| hp(a, 3, i));
    let scale = grad_scale(a, 3, 3);
    let (w, g, vel) = (
        a.dst.row_f32_ptr(0, 0, 0),
        a.src(1).row_f32_ptr(0, 0, 0),
        a.src(2).row_f32_ptr(0, 0, 0),
    );
    for i in split(a.dst.layout.n_elements(), ctx.ith, ctx.nth) {
        // SAFETY: contiguous F32 tensors of the parameter's size; element i is this thread's.
        unsafe {
            let vi = momentum * vel.add(i).read() + g.add(i).read() * scale;
            vel.add(i).write(vi);
            w.add(i).write(w.add(i).read() * (1.0 - lr * wd) - lr * vi);
        }
    }
}

#[cfg(test)]
mod tests {
    /// The AVX-512 and AVX2 AdamW loops equal the scalar one bit for bit (tails included).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn adamw_simd_is_bit_identical() {
        use crate::simd::{required_by_test, Isa};
        if required_by_test("AVX2 AdamW", Isa::available().contains(&Isa::Avx2)) {
            check(super::adamw_avx2);
        }
        if required_by_test("AVX-512 AdamW", crate::simd::vexp::available()) {
            check(super::adamw_avx512);
        }
    }

    type Loop = unsafe fn(&super::AdamHp, [*mut f32; 4], std::ops::Range<usize>) -> usize;

    fn check(simd: Loop) {
        let n = 16 * 37 + 5;
        let val = |i: usize, k: u32| {
            let x = (i as u32)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(k.wrapping_mul(40_503));
            (x >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        };
        let h = super::AdamHp {
            beta1: 0.9,
            beta2: 0.999,
            beta1h: 1.0 / (1.0 - 0.9f32.powi(3)),
            beta2h: 1.0 / (1.0 - 0.999f32.powi(3)),
            eps: 1e-8,
            lr: 1e-3,
            keep: 1.0 - 1e-3 * 0.01,
            scale: 0.75,
        };
        let mut t: [Vec<f32>; 4] = std::array::from_fn(|k| {
            (0..n)
                .map(|i| {
                    if k == 3 {
                        val(i, 3).abs() * 1e-3
                    } else {
                        val(i, k as u32)
                    }
                })
                .collect()
        });
        let want: Vec<[f32; 3]> = (0..n)
            .map(|i| {
                let (w, g, m, v) = (t[0][i], t[1][i] * h.scale, t[2][i], t[3][i]);
                let mi = m * h.beta1 + g * (1.0 - h.beta1);
                let vi = v * h.beta2 + g * g * (1.0 - h.beta2);
                let step = (mi * h.beta1h) / ((vi * h.beta2h).sqrt() + h.eps);
                [w * h.keep - h.lr * step, mi, vi]
            })
            .collect();
        let ptrs: [*mut f32; 4] = std::array::from_fn(|k| t[k].as_mut_ptr());
        // SAFETY: the caller checked the instruction set; four distinct vectors of n values.
        let done = unsafe { simd(&h, ptrs, 0..n) };
        assert_eq!(done, n / 16 * 16);
        for (i, w) in want.iter().enumerate().take(done) {
            let got = [t[0][i], t[2][i], t[3][i]];
            assert_eq!(got.map(f32::to_bits), w.map(f32::to_bits), "element {i}");
        }
    }
}
