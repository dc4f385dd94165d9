//! Weights repacked at load time into a layout built for the integer dot instructions.
//!
//! A packed matrix interleaves 16 weight rows: for every 32-element block it stores the 16
//! rows' scales side by side, then their quants so that one 64-byte load holds 4 bytes of each
//! of the 16 rows. One `vpdpbusd` then multiplies 16 rows by the same broadcast 4 activation
//! bytes, so a group of 16 outputs needs no horizontal sums, and a tile of up to 8 tokens
//! reuses each unpacked weight register 8 times (the prefill GEMM). Decode (one token) reads
//! the same layout at memory speed.
//!
//! Activations are Q8_1 blocks (36 bytes: f16 scale, a 16-bit slot, 32 × i8). For Q4_1 the
//! slot is ggml's `s = d·Σq` (f16); for Q8_0, whose quants are stored biased by +128 (u8), the
//! slot is the exact i16 `Σq` that removes the bias.
//!
//! Packing happens only where the kernels exist (AVX-512 VNNI); [`PackedWeight::matmul_ref`]
//! is the scalar oracle of the tests.

mod q4_1x16;
mod q8_0x16;

use std::ops::Range;

use tinynn_core::quant;
use tinynn_format::GgmlType;

use crate::memory::AlignedBuf;
use crate::simd::Isa;

/// Rows interleaved in one group.
pub const GROUP_ROWS: usize = 16;
/// Bytes of one activation block (Q8_1 layout).
pub const ACT_BLOCK_BYTES: usize = 36;

/// The packed layouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackKind {
    /// From Q4_1: per block 16 × f16 d, 16 × f16 m, 4 × (16 rows × 4 nibble bytes) = 320 B.
    Q4_1x16,
    /// From Q8_0: per block 16 × f16 d, 8 × (16 rows × 4 bytes of q + 128) = 544 B.
    Q8_0x16,
}

impl PackKind {
    fn of(ty: GgmlType) -> Option<PackKind> {
        match ty {
            GgmlType::Q4_1 => Some(PackKind::Q4_1x16),
            GgmlType::Q8_0 => Some(PackKind::Q8_0x16),
            _ => None,
        }
    }

    /// Bytes of one group's block.
    fn block_bytes(self) -> usize {
        match self {
            PackKind::Q4_1x16 => 320,
            PackKind::Q8_0x16 => 544,
        }
    }
}

/// A 2-D weight `[k, n_rows]` in a packed layout.
pub struct PackedWeight {
    kind: PackKind,
    source: GgmlType,
    k: usize,
    n_rows: usize,
    data: AlignedBuf,
}

/// Whether this machine runs packed kernels (AVX-512 VNNI, not capped by `TINYNN_ISA`).
pub fn available() -> bool {
    Isa::detected() >= Isa::Avx512Vnni
}

/// Packs weight `bytes` of type `ty` and shape `ne` (contiguous rows), or `None` when the type
/// or shape has no packed kernel or this machine lacks the instructions.
pub fn pack(ty: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<PackedWeight> {
    if !available() {
        return None;
    }
    pack_always(ty, ne, bytes)
}

/// [`pack`] without the instruction-set check (tests of the layout and reference run anywhere).
pub fn pack_always(ty: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<PackedWeight> {
    let kind = PackKind::of(ty)?;
    let [k, n_rows, n2, n3] = ne;
    if n2 != 1 || n3 != 1 || k == 0 || n_rows == 0 || !k.is_multiple_of(32) {
        return None;
    }
    let row_bytes = quant::row_bytes(ty, k).ok()?;
    if bytes.len() != row_bytes.checked_mul(n_rows)? {
        return None;
    }
    let nb = k / 32;
    let n_groups = n_rows.div_ceil(GROUP_ROWS);
    let mut data = AlignedBuf::zeroed(n_groups * nb * kind.block_bytes());
    let out = data.as_bytes_mut();
    for g in 0..n_groups {
        for r in 0..GROUP_ROWS.min(n_rows - g * GROUP_ROWS) {
            let row = &bytes[(g * GROUP_ROWS + r) * row_bytes..][..row_bytes];
            for b in 0..nb {
                let dst = &mut out[(g * nb + b) * kind.block_bytes()..][..kind.block_bytes()];
                match kind {
                    PackKind::Q4_1x16 => q4_1x16::pack_block(&row[b * 20..][..20], r, dst),
                    PackKind::Q8_0x16 => q8_0x16::pack_block(&row[b * 34..][..34], r, dst),
                }
            }
        }
    }
    Some(PackedWeight {
        kind,
        source: ty,
        k,
        n_rows,
        data,
    })
}

impl PackedWeight {
    pub fn kind(&self) -> PackKind {
        self.kind
    }

    /// The file type it was packed from.
    pub fn source_type(&self) -> GgmlType {
        self.source
    }

    /// `[k, n_rows]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.k, self.n_rows]
    }

    /// Bytes the packed copy occupies.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub fn n_groups(&self) -> usize {
        self.n_rows.div_ceil(GROUP_ROWS)
    }

    /// Bytes of one quantized activation row.
    pub fn activation_row_bytes(&self) -> usize {
        self.k / 32 * ACT_BLOCK_BYTES
    }

    /// Quantizes f32 activations (a row, or a run of whole blocks of one) into `out`
    /// (`x.len() / 32` blocks of [`ACT_BLOCK_BYTES`]).
    pub fn quantize_activations(&self, x: &[f32], out: &mut [u8]) {
        crate::simd::quantize_q8::q8_1_row(x, out, self.kind == PackKind::Q8_0x16);
    }

    /// `out[t·out_stride + n] = Σ_k w[n, k] · x_t[k]` for tokens `t < m` and the rows of
    /// `groups`, with `x_t` the quantized activation row at `acts[t·act_stride..]`.
    ///
    /// # Safety
    /// `acts` holds `m` rows of `activation_row_bytes()` at stride `act_stride`; `out` has room
    /// for `m` rows at stride `out_stride` f32s covering columns `groups × 16` (clipped to
    /// `n_rows`), and no other thread writes those columns meanwhile.
    pub unsafe fn matmul_raw(
        &self,
        acts: *const u8,
        act_stride: usize,
        m: usize,
        out: *mut f32,
        out_stride: usize,
        groups: Range<usize>,
    ) {
        let nb = self.k / 32;
        let gb = nb * self.kind.block_bytes();
        for g in groups {
            let w = self.data.as_bytes()[g * gb..][..gb].as_ptr();
            let valid = GROUP_ROWS.min(self.n_rows - g * GROUP_ROWS);
            // SAFETY: forwarded from the caller; the group's columns start at g·16.
            unsafe {
                let out_g = out.add(g * GROUP_ROWS);
                match self.kind {
                    PackKind::Q4_1x16 => {
                        q4_1x16::matmul_group(w, nb, acts, act_stride, m, out_g, out_stride, valid)
                    }
                    PackKind::Q8_0x16 => {
                        q8_0x16::matmul_group(w, nb, acts, act_stride, m, out_g, out_stride, valid)
                    }
                }
            }
        }
    }

    /// The whole product with the fastest kernel: `acts` is `m` activation rows back to back,
    /// `out` is `m × n_rows`.
    pub fn matmul(&self, acts: &[u8], m: usize, out: &mut [f32]) {
        assert!(available(), "packed kernels need AVX-512 VNNI");
        assert_eq!(acts.len(), m * self.activation_row_bytes());
        assert_eq!(out.len(), m * self.n_rows);
        // SAFETY: sizes checked above; one thread writes everything.
        unsafe {
            self.matmul_raw(
                acts.as_ptr(),
                self.activation_row_bytes(),
                m,
                out.as_mut_ptr(),
                self.n_rows,
                0..self.n_groups(),
            )
        }
    }

    /// Scalar reference of [`PackedWeight::matmul`], reading the packed layout.
    pub fn matmul_ref(&self, acts: &[u8], m: usize, out: &mut [f32]) {
        assert_eq!(acts.len(), m * self.activation_row_bytes());
        assert_eq!(out.len(), m * self.n_rows);
        let nb = self.k / 32;
        let gb = nb * self.kind.block_bytes();
        for t in 0..m {
            let x = &acts[t * self.activation_row_bytes()..][..self.activation_row_bytes()];
            for n in 0..self.n_rows {
                let (g, r) = (n / GROUP_ROWS, n % GROUP_ROWS);
                let w = &self.data.as_bytes()[g * gb..][..gb];
                out[t * self.n_rows + n] = match self.kind {
                    PackKind::Q4_1x16 => q4_1x16::dot_ref(w, nb, r, x),
                    PackKind::Q8_0x16 => q8_0x16::dot_ref(w, nb, r, x),
                };
            }
        }
    }
}

/// The f16 at `b[0..2]`.
fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}
