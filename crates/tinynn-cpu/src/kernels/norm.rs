//! RMS normalization of rows (ggml accumulates the sum of squares in f64).

use super::elementwise::each_pair;
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
        let row = unsafe { x.row_f32(i1, i2, i3) };
        let sum = dot64(row, row);
        let n = dst.layout.ne[0];
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        let (inp, out) = (x.row_f32_ptr(i1, i2, i3), dst.row_f32_ptr(i1, i2, i3));
        // SAFETY: both rows hold n f32s (in place, the same row).
        unsafe { each_pair(inp, inp, out, n, |p, _| p * scale) };
    }
}

/// `Σ a·b` in f64, in eight interleaved partial sums (independent add chains: a row runs at
/// the loads' speed, not one add latency per element), combined pairwise; the order is
/// fixed, so every instruction set gives the same bits. RMS norm's `Σ x²` and its gradient's.
pub(crate) fn dot64(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f64 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum();
    for (x, y) in ca.zip(cb) {
        for ((s, &p), &q) in acc.iter_mut().zip(x).zip(y) {
            *s += f64::from(p) * f64::from(q);
        }
    }
    let a4 = [0, 1, 2, 3].map(|i| acc[i] + acc[i + 4]);
    (a4[0] + a4[2]) + (a4[1] + a4[3]) + tail
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
    use super::dot64;

    /// Every length (whole 8-value chunks and tails): the eight lanes folded in the order the
    /// doc gives (so every ISA agrees), within f64 rounding of the serial sum.
    #[test]
    fn dot64_is_the_lane_ordered_f64_sum() {
        let mut state = 3u64;
        for n in 0..300 {
            let row: Vec<f32> = (0..n)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 10.0
                })
                .collect();
            let sq = |v: f32| f64::from(v) * f64::from(v);
            let mut lanes = [0f64; 8];
            for (i, &v) in row.iter().enumerate().take(n / 8 * 8) {
                lanes[i % 8] += sq(v);
            }
            let tail: f64 = row[n / 8 * 8..].iter().map(|&v| sq(v)).sum();
            let a4 = [0, 1, 2, 3].map(|i| lanes[i] + lanes[i + 4]);
            let want = (a4[0] + a4[2]) + (a4[1] + a4[3]) + tail;
            let got = dot64(&row, &row);
            assert_eq!(got.to_bits(), want.to_bits(), "n {n}");
            let serial: f64 = row.iter().map(|&v| sq(v)).sum();
            assert!((got - serial).abs() <= 1e-12 * serial.max(1.0), "n {n}");
        }
    }
}
