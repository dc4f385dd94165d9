//! RMS normalization of rows (ggml accumulates the sum of squares in f64).

use super::elementwise::{overlap, Overlap};
use super::{row_index, split, StepArgs};
use crate::pool::Ctx;

pub(crate) fn rms_norm(eps: f32, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let x = a.src(0);
    let dst = a.dst;
    // Whole rows per thread: `executor/groups.rs` chains row-wise steps on that.
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        // SAFETY: rows are contiguous F32 (builder-checked); row r is this thread's. In place,
        // input and output are the same row, read fully before it is written.
        let sum = sum_of_squares(unsafe { x.row_f32(i1, i2, i3) });
        let n = dst.layout.ne[0];
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        let (inp, out) = (x.row_f32_ptr(i1, i2, i3), dst.row_f32_ptr(i1, i2, i3));
        // SAFETY: both rows hold n f32s; a mutable slice is made only when the rows are the
        // same (in place) or apart.
        unsafe {
            match overlap(out, inp, n) {
                Overlap::Same => {
                    let o = std::slice::from_raw_parts_mut(out, n);
                    o.iter_mut().for_each(|v| *v *= scale);
                }
                Overlap::Apart => {
                    let o = std::slice::from_raw_parts_mut(out, n);
                    for (v, &p) in o.iter_mut().zip(std::slice::from_raw_parts(inp, n)) {
                        *v = p * scale;
                    }
                }
                Overlap::Partly => {
                    for j in 0..n {
                        out.add(j).write(inp.add(j).read() * scale);
                    }
                }
            }
        }
    }
}

/// `Σ v²` in f64 (each square exact): sixteen running sums, lane `j` taking values `j`,
/// `j + 16`, …, folded in halves (8, 4, 2, 1), then the tail. The order is fixed, so every
/// instruction set gives the same bits; one running sum would wait four cycles an element.
pub(crate) fn sum_of_squares(row: &[f32]) -> f64 {
    let mut acc = [0f64; 16];
    let chunks = row.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v) * f64::from(v);
        }
    }
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    tail.iter()
        .fold(acc[0], |s, &v| s + f64::from(v) * f64::from(v))
}

pub(crate) fn layer_norm(
    eps: f32,
    has_weight: bool,
    has_bias: bool,
    a: &StepArgs<'_>,
    ctx: &Ctx<'_>,
) {
    let x = a.src(0);
    let weight = has_weight.then(|| a.src(1));
    let bias = has_bias.then(|| a.src(if has_weight { 2 } else { 1 }));
    let dst = a.dst;
    let n = dst.layout.ne[0];
    for r in split(dst.layout.n_rows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = row_index(&dst.layout, r);
        // SAFETY: contiguous F32 rows (builder-checked); this thread's row.
        let row = unsafe { x.row_f32(i1, i2, i3) };
        let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / n as f64;
        let var = row
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n as f64;
        let (mean, scale) = (mean as f32, (1.0 / (var + f64::from(eps)).sqrt()) as f32);
        let (inp, out) = (row.as_ptr(), dst.row_f32_ptr(i1, i2, i3));
        let w = weight.map(|w| w.row_f32_ptr(0, 0, 0));
        let b = bias.map(|b| b.row_f32_ptr(0, 0, 0));
        for j in 0..n {
            // SAFETY: j < ne0 in the input, output, weight and bias rows (all [ne0]).
            unsafe {
                let mut v = (inp.add(j).read() - mean) * scale;
                if let Some(w) = w {
                    v *= w.add(j).read();
                }
                if let Some(b) = b {
                    v += b.add(j).read();
                }
                out.add(j).write(v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::sum_of_squares;

    /// Every length (whole 16-value chunks and tails): the sum of exact squares to within
    /// f64 rounding, and the lane order it promises.
    #[test]
    fn sum_of_squares_is_the_lane_ordered_f64_sum() {
        let mut state = 3u64;
        for n in 0..300 {
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10.0
                })
                .collect();
            let sq = |v: f32| f64::from(v) * f64::from(v);
            let mut lanes = [0f64; 16];
            for (i, &v) in row.iter().enumerate().take(n / 16 * 16) {
                lanes[i % 16] += sq(v);
            }
            let folded = [8, 4, 2, 1].iter().fold(lanes, |mut l, &w| {
                for j in 0..w {
                    l[j] += l[j + w];
                }
                l
            });
            let want = row[n / 16 * 16..].iter().fold(folded[0], |s, &v| s + sq(v));
            let got = sum_of_squares(&row);
            assert_eq!(got.to_bits(), want.to_bits(), "n {n}");
            let serial: f64 = row.iter().map(|&v| sq(v)).sum();
            assert!((got - serial).abs() <= 1e-12 * serial.max(1.0), "n {n}");
        }
    }
}
