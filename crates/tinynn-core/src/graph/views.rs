//! Views: tensors that alias another tensor's memory with a new shape or stride order.

use super::{err, full_shape, Graph, Mem, Result};
use crate::ops::Op;
use crate::tensor::{Layout, TensorId, MAX_DIMS};

impl Graph {
    /// A view of `a` with shape `ne`, byte strides `nb[1..]` and a byte `offset` into `a`
    /// (`nb[0]` is the element/block size). The view must stay inside `a`'s memory.
    pub fn view(
        &mut self,
        a: TensorId,
        ne: &[usize],
        nb: &[usize],
        offset: usize,
    ) -> Result<TensorId> {
        const OP: &str = "view";
        self.check_id(OP, a)?;
        if nb.len() + 1 != ne.len() {
            return err(
                OP,
                format!(
                    "give one byte stride per dimension after the first ({} for {ne:?})",
                    ne.len().saturating_sub(1)
                ),
            );
        }
        let ne = full_shape(OP, ne)?;
        let la = *self.layout(a);
        let block = la.dtype.layout();
        if ne[0] % block.block_elems as usize != 0 {
            return err(
                OP,
                format!(
                    "row length {} is not a whole number of {} blocks",
                    ne[0], la.dtype
                ),
            );
        }
        let elem = block.block_bytes as usize;
        let row = ne[0] / block.block_elems as usize * elem;
        let mut strides = [elem, row, 0, 0];
        for i in 1..MAX_DIMS {
            strides[i] = match nb.get(i - 1) {
                Some(&s) => s,
                None => strides[i - 1] * ne[i - 1].max(1),
            };
        }
        // Elements must stay aligned to their size (so kernels can read them as slices).
        let align = elem.min(4);
        if !offset.is_multiple_of(align) || strides[1..].iter().any(|s| s % align != 0) {
            return err(OP, "offset and strides must keep elements aligned");
        }
        let layout = Layout {
            dtype: la.dtype,
            ne,
            nb: strides,
        };
        let (root, root_off) = self.root(a);
        let root_bytes = self.layout(root).contiguous_bytes();
        let end = (1..MAX_DIMS).try_fold(root_off + offset + row, |acc, i| {
            (ne[i] - 1)
                .checked_mul(strides[i])
                .and_then(|s| acc.checked_add(s))
        });
        match end {
            Some(end) if end <= root_bytes => {}
            _ => {
                return err(
                    OP,
                    format!(
                        "view {ne:?} at offset {offset} overruns '{}' ({root_bytes} bytes)",
                        self.node(a).name
                    ),
                )
            }
        }
        let name = format!("{} (view)", self.node(a).name);
        Ok(self.push(
            name,
            layout,
            Op::View,
            vec![a],
            Mem::Alias { base: a, offset },
        ))
    }

    /// `a` (contiguous) seen with another shape of the same element count.
    pub fn reshape(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId> {
        const OP: &str = "reshape";
        self.check_id(OP, a)?;
        let la = *self.layout(a);
        let ne = full_shape(OP, ne)?;
        if !la.is_contiguous() {
            return err(OP, "needs a contiguous tensor (use cont first)");
        }
        if ne.iter().product::<usize>() != la.n_elements()
            || ne[0] % la.dtype.layout().block_elems as usize != 0
        {
            return err(OP, format!("{:?} cannot become {ne:?}", la.ne));
        }
        let layout = Layout::contiguous(la.dtype, ne);
        let name = format!("{} (reshaped)", self.node(a).name);
        Ok(self.push(
            name,
            layout,
            Op::View,
            vec![a],
            Mem::Alias { base: a, offset: 0 },
        ))
    }

    /// Moves dimension `i` of `a` to position `axes[i]` (ggml's `permute`).
    pub fn permute(&mut self, a: TensorId, axes: [usize; MAX_DIMS]) -> Result<TensorId> {
        const OP: &str = "permute";
        self.check_id(OP, a)?;
        let mut seen = [false; MAX_DIMS];
        for &ax in &axes {
            if ax >= MAX_DIMS || std::mem::replace(&mut seen[ax], true) {
                return err(OP, format!("{axes:?} is not a permutation of 0..4"));
            }
        }
        let la = *self.layout(a);
        if la.dtype.is_quantized() && axes[0] != 0 {
            return err(OP, "cannot move the row dimension of a quantized tensor");
        }
        let mut layout = la;
        for (i, &ax) in axes.iter().enumerate() {
            layout.ne[ax] = la.ne[i];
            layout.nb[ax] = la.nb[i];
        }
        let name = format!("{} (permuted)", self.node(a).name);
        Ok(self.push(
            name,
            layout,
            Op::View,
            vec![a],
            Mem::Alias { base: a, offset: 0 },
        ))
    }

    /// Swaps the first two dimensions.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        self.permute(a, [1, 0, 2, 3])
    }
}
