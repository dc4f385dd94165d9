//! The scalar reference of the packed product, reading the packed layout: what every tile
//! kernel is tested against.

use super::{PackedWeight, GROUP_ROWS};

impl PackedWeight {
    /// Scalar reference of [`PackedWeight::matmul`], reading the packed layout.
    pub fn matmul_ref(&self, acts: &[u8], m: usize, out: &mut [f32]) {
        assert_eq!(acts.len(), m * self.activation_row_bytes());
        assert_eq!(out.len(), m * self.n_rows);
        let nb = self.n_blocks();
        let gb = nb * self.kind.block_bytes();
        for t in 0..m {
            let x = &acts[t * self.activation_row_bytes()..][..self.activation_row_bytes()];
            for n in 0..self.n_rows {
                let (g, r) = (n / GROUP_ROWS, n % GROUP_ROWS);
                let w = &self.data.as_bytes()[g * gb..][..gb];
                out[t * self.n_rows + n] = self.kind.dot_ref(w, nb, r, x);
            }
        }
    }
}
