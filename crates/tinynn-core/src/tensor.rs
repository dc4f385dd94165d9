//! Tensor descriptors: element type, shape and byte strides in ggml order (`ne[0]` is the
//! innermost, contiguous dimension; `nb[i]` is the byte step along dimension i).

use tinynn_format::GgmlType;

pub const MAX_DIMS: usize = 4;

/// A tensor of a [`Graph`](crate::graph::Graph), by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Element type, shape and strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub dtype: GgmlType,
    /// Elements per dimension, innermost first; unused dimensions are 1.
    pub ne: [usize; MAX_DIMS],
    /// Bytes between consecutive indices of each dimension (`nb[0]` is a block's size).
    pub nb: [usize; MAX_DIMS],
}

impl Layout {
    /// A contiguous layout. `ne[0]` must be a whole number of blocks (checked by the builder).
    pub fn contiguous(dtype: GgmlType, ne: [usize; MAX_DIMS]) -> Layout {
        let l = dtype.layout();
        let mut nb = [0; MAX_DIMS];
        nb[0] = l.block_bytes as usize;
        nb[1] = nb[0] * (ne[0] / l.block_elems as usize);
        for i in 2..MAX_DIMS {
            nb[i] = nb[i - 1] * ne[i - 1];
        }
        Layout { dtype, ne, nb }
    }

    pub fn n_elements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Rows of `ne[0]` elements.
    pub fn n_rows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one contiguous row.
    pub fn row_bytes(&self) -> usize {
        let l = self.dtype.layout();
        self.ne[0] / l.block_elems as usize * l.block_bytes as usize
    }

    /// Bytes of the whole tensor if it were contiguous.
    pub fn contiguous_bytes(&self) -> usize {
        self.row_bytes() * self.n_rows()
    }

    /// Bytes from the first to one past the last element this layout touches.
    pub fn span_bytes(&self) -> usize {
        if self.n_elements() == 0 {
            return 0;
        }
        let last: usize = (1..MAX_DIMS).map(|i| (self.ne[i] - 1) * self.nb[i]).sum();
        last + self.row_bytes()
    }

    pub fn is_contiguous(&self) -> bool {
        *self == Layout::contiguous(self.dtype, self.ne)
    }

    /// Rows are contiguous (`nb[0]` is one block), whatever the outer strides.
    pub fn rows_contiguous(&self) -> bool {
        self.nb[0] == self.dtype.layout().block_bytes as usize
    }

    /// Number of dimensions up to the last one that is not 1 (at least 1).
    pub fn n_dims(&self) -> usize {
        (1..MAX_DIMS)
            .rev()
            .find(|&i| self.ne[i] > 1)
            .map_or(1, |i| i + 1)
    }

    /// Byte offset of row `(i1, i2, i3)`.
    pub fn row_offset(&self, i1: usize, i2: usize, i3: usize) -> usize {
        i1 * self.nb[1] + i2 * self.nb[2] + i3 * self.nb[3]
    }
}
