//! Copies with conversion between any readable and any writable type (cpy, cont), and the
//! row converter mul_mat uses for its activations. Work goes in chunks of 256 elements (a
//! multiple of every block size) through a stack buffer, so no memory is allocated.

use tinynn_core::quant::{self, half};
use tinynn_format::GgmlType;

use super::{row_index, split, RawTensor, StepArgs, ERR_KERNEL};
use crate::pool::Ctx;

pub(crate) const CHUNK: usize = 256;

impl RawTensor {
    /// The element at `i` of a float tensor as f32.
    ///
    /// # Safety
    /// `i` is inside the layout; the type is F32, F16 or BF16.
    #[inline]
    pub(crate) unsafe fn float_at(&self, i: [usize; 4]) -> f32 {
        // SAFETY: in bounds by the caller's contract; unaligned reads are always valid.
        unsafe {
            let p = self.ptr.add(self.elem_offset(i));
            match self.layout.dtype {
                GgmlType::F16 => half::f16_to_f32((p as *const u16).read_unaligned()),
                GgmlType::Bf16 => half::bf16_to_f32((p as *const u16).read_unaligned()),
                _ => (p as *const f32).read_unaligned(),
            }
        }
    }

    /// Stores `v` at `i` of a float tensor.
    ///
    /// # Safety
    /// `i` is inside the layout, the type is F32, F16 or BF16, and no other thread touches
    /// this element during the step.
    #[inline]
    pub(crate) unsafe fn set_float(&self, i: [usize; 4], v: f32) {
        // SAFETY: as above.
        unsafe {
            let p = self.ptr.add(self.elem_offset(i));
            match self.layout.dtype {
                GgmlType::F16 => (p as *mut u16).write_unaligned(half::f32_to_f16(v)),
                GgmlType::Bf16 => (p as *mut u16).write_unaligned(half::f32_to_bf16(v)),
                _ => (p as *mut f32).write_unaligned(v),
            }
        }
    }
}

/// Reads elements `c0..c0+buf.len()` of row `(i1, i2, i3)` of `src` as f32.
///
/// # Safety
/// The row is inside `src`; quantized sources have contiguous rows.
pub(crate) unsafe fn read_chunk(
    src: &RawTensor,
    row: (usize, usize, usize),
    c0: usize,
    buf: &mut [f32],
) -> bool {
    let (i1, i2, i3) = row;
    let ty = src.layout.dtype;
    if ty.is_quantized() {
        let l = ty.layout();
        let start = c0 / l.block_elems as usize * l.block_bytes as usize;
        let len = buf.len() / l.block_elems as usize * l.block_bytes as usize;
        // SAFETY: contiguous row (caller), and the chunk is inside it.
        let bytes = unsafe { &src.row(i1, i2, i3)[start..start + len] };
        return quant::dequantize_row(ty, bytes, buf).is_ok();
    }
    for (j, b) in buf.iter_mut().enumerate() {
        // SAFETY: c0 + j < ne0.
        *b = unsafe { src.float_at([c0 + j, i1, i2, i3]) };
    }
    true
}

/// Writes `buf` as elements `c0..` of row `(i1, i2, i3)` of `dst`; `activations` selects the
/// run-time activation quantizer (see `quant::quantize_activations`).
///
/// # Safety
/// The row is inside `dst` and belongs to this thread; quantized destinations have contiguous rows.
unsafe fn write_chunk(
    dst: &RawTensor,
    row: (usize, usize, usize),
    c0: usize,
    buf: &[f32],
    activations: bool,
) -> bool {
    let (i1, i2, i3) = row;
    let ty = dst.layout.dtype;
    if ty.is_quantized() {
        let l = ty.layout();
        let start = c0 / l.block_elems as usize * l.block_bytes as usize;
        let len = buf.len() / l.block_elems as usize * l.block_bytes as usize;
        // SAFETY: contiguous row owned by this thread (caller).
        let bytes = unsafe { &mut dst.row_mut(i1, i2, i3)[start..start + len] };
        let done = if activations {
            crate::simd::quantize_q8::q8_activations(ty, buf, bytes)
        } else {
            quant::quantize_row(ty, buf, bytes)
        };
        return done.is_ok();
    }
    for (j, &v) in buf.iter().enumerate() {
        // SAFETY: c0 + j < ne0; this thread's row.
        unsafe { dst.set_float([c0 + j, i1, i2, i3], v) };
    }
    true
}

/// Converts row `src_row` of `src` into row `dst_row` of `dst` (same row length).
///
/// # Safety
/// As [`read_chunk`] and [`write_chunk`].
pub(crate) unsafe fn convert_row(
    src: &RawTensor,
    src_row: (usize, usize, usize),
    dst: &RawTensor,
    dst_row: (usize, usize, usize),
) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { convert(src, src_row, dst, dst_row, false) }
}

/// [`convert_row`] for a matrix product's activations (the run-time Q8 quantizer).
///
/// # Safety
/// As [`convert_row`].
pub(crate) unsafe fn convert_activations(
    src: &RawTensor,
    src_row: (usize, usize, usize),
    dst: &RawTensor,
    dst_row: (usize, usize, usize),
) -> bool {
    // SAFETY: forwarded from the caller.
    unsafe { convert(src, src_row, dst, dst_row, true) }
}

/// # Safety
/// As [`convert_row`].
unsafe fn convert(
    src: &RawTensor,
    src_row: (usize, usize, usize),
    dst: &RawTensor,
    dst_row: (usize, usize, usize),
    activations: bool,
) -> bool {
    let n = dst.layout.ne[0];
    let (s, d) = (&src.layout, &dst.layout);
    if s.dtype == GgmlType::F32 && d.dtype == GgmlType::F32 && s.nb[0] == 4 && d.nb[0] == 4 {
        // SAFETY: both rows exist with n contiguous f32s (caller and the check above); a
        // memmove, whatever the planner does with overlaps.
        unsafe {
            std::ptr::copy(
                src.row_f32_ptr(src_row.0, src_row.1, src_row.2),
                dst.row_f32_ptr(dst_row.0, dst_row.1, dst_row.2),
                n,
            )
        };
        return true;
    }
    if s.dtype == GgmlType::F32 && d.dtype == GgmlType::F16 && s.nb[0] == 4 && d.nb[0] == 2 {
        // SAFETY: both rows exist with contiguous elements (caller and the check above); the
        // planner keeps a copy's output apart from its input.
        unsafe {
            crate::simd::quantize_q8::f32_to_f16_row(
                src.row_f32_ptr(src_row.0, src_row.1, src_row.2),
                dst.ptr.add(d.row_offset(dst_row.0, dst_row.1, dst_row.2)),
                n,
            )
        };
        return true;
    }
    let mut buf = [0f32; CHUNK];
    let mut c0 = 0;
    while c0 < n {
        let len = CHUNK.min(n - c0);
        // SAFETY: forwarded from the caller.
        let ok = unsafe {
            read_chunk(src, src_row, c0, &mut buf[..len])
                && write_chunk(dst, dst_row, c0, &buf[..len], activations)
        };
        if !ok {
            return false;
        }
        c0 += len;
    }
    true
}

/// Unravels flat element `e` over shape `ne`.
fn unravel(e: usize, ne: [usize; 4]) -> [usize; 4] {
    [
        e % ne[0],
        (e / ne[0]) % ne[1],
        (e / (ne[0] * ne[1])) % ne[2],
        e / (ne[0] * ne[1] * ne[2]),
    ]
}

pub(crate) fn cpy(src: RawTensor, dst: RawTensor, a: &StepArgs<'_>, ctx: &Ctx<'_>) {
    let (ls, ld) = (src.layout, dst.layout);
    if ls.ne[0] == ld.ne[0] {
        for r in split(ld.n_rows(), ctx.ith, ctx.nth) {
            // SAFETY: flat row r exists in both (same element count and row length); this
            // thread owns destination row r.
            let ok = unsafe { convert_row(&src, row_index(&ls, r), &dst, row_index(&ld, r)) };
            if !ok {
                a.errors.record(ERR_KERNEL, 0);
            }
        }
        return;
    }
    // Different row lengths (float types only, builder-checked): element by element.
    for e in split(ld.n_elements(), ctx.ith, ctx.nth) {
        // SAFETY: flat index e is inside both shapes; this thread owns element e of dst.
        unsafe { dst.set_float(unravel(e, ld.ne), src.float_at(unravel(e, ls.ne))) };
    }
}
