//! What the K-quants share: a 256-element super-block of small integers, split into sub-blocks
//! of 16 or 32 that each have an integer scale (and, for Q2_K/Q4_K/Q5_K, an integer minimum):
//! `x[i] = d * scale[s] * q[i] - dmin * min[s]` with `s = i / sub_len`.
//!
//! Each K format only says how to unpack its bits into [`KUnpacked`]; dequantization and the
//! integer dot product with Q8_K are written once here.

use super::q8_k::BlockQ8K;

pub const QK_K: usize = 256;

pub struct KUnpacked {
    pub d: f32,
    pub dmin: f32,
    /// 16 or 32.
    pub sub_len: usize,
    /// One per sub-block (`QK_K / sub_len` of them).
    pub scales: [i32; 16],
    pub mins: [i32; 16],
    /// The quantized values with any offset already applied (e.g. Q6_K's −32).
    pub q: [i8; QK_K],
}

impl KUnpacked {
    pub fn new(d: f32, dmin: f32, sub_len: usize) -> Self {
        KUnpacked {
            d,
            dmin,
            sub_len,
            scales: [0; 16],
            mins: [0; 16],
            q: [0; QK_K],
        }
    }

    pub fn dequantize(&self, out: &mut [f32]) {
        for (s, (o, q)) in out
            .chunks_exact_mut(self.sub_len)
            .zip(self.q.chunks_exact(self.sub_len))
            .enumerate()
        {
            let dl = self.d * self.scales[s] as f32;
            let ml = self.dmin * self.mins[s] as f32;
            for (o, &q) in o.iter_mut().zip(q) {
                *o = dl * f32::from(q) - ml;
            }
        }
    }

    /// `Σ x[i] * y[i]` with integer sums per sub-block, then one float scale per super-block.
    pub fn vec_dot(&self, y: &BlockQ8K) -> f32 {
        let (mut sum_q, mut sum_m) = (0i32, 0i32);
        for s in 0..QK_K / self.sub_len {
            let range = s * self.sub_len..(s + 1) * self.sub_len;
            let (xq, yq) = (&self.q[range.clone()], &y.qs[range]);
            let dot: i32 = xq
                .iter()
                .zip(yq)
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum();
            let ysum: i32 = yq.iter().map(|&b| i32::from(b)).sum();
            sum_q += self.scales[s] * dot;
            sum_m += self.mins[s] * ysum;
        }
        let dy = y.d();
        self.d * dy * sum_q as f32 - self.dmin * dy * sum_m as f32
    }
}

/// The 6-bit scale and minimum of sub-block `j` (0..8) from Q4_K/Q5_K's 12 packed bytes.
pub fn scale_min_k4(j: usize, s: &[u8; 12]) -> (i32, i32) {
    if j < 4 {
        (i32::from(s[j] & 63), i32::from(s[j + 4] & 63))
    } else {
        let sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        let m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        (i32::from(sc), i32::from(m))
    }
}
