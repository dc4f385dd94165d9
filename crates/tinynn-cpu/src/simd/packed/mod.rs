//! Weights repacked at load time into a layout built for the integer dot instructions.
//!
//! A packed matrix interleaves 16 weight rows: for every 32-element block it stores the 16
//! rows' scales side by side, then their quants so that one 64-byte load holds 4 bytes of each
//! of the 16 rows. One `vpdpbusd` then multiplies 16 rows by the same broadcast 4 activation
//! bytes, so a group of 16 outputs needs no horizontal sums, and a tile of up to 8 tokens
//! reuses each unpacked weight register 8 times (the prefill GEMM). Decode (one token) reads
//! the same layout at memory speed.
//!
//! The K kinds (Q4_K, Q6_K) keep the file's 256-element super-blocks: the 16 rows' scales
//! decoded to one byte each, the quants in the same 4-bytes-of-16-rows lanes, and take ggml's
//! Q8_K activations (one f32 scale per 256 values and the 16-value sums), so they compute what
//! ggml's `vec_dot_q4_K_q8_K` / `vec_dot_q6_K_q8_K` compute (see `q4_kx16`, `q6_kx16`).
//!
//! Activations of the other quantized kinds are Q8_1 blocks (36 bytes: f16 scale, a 16-bit slot,
//! 32 × i8). For the kinds with a min (Q4_1, Q5_1) the slot is ggml's `s = d·Σq` (f16); for
//! the kinds whose weights are stored with a bias (Q4_0 `q + 8`, Q5_0 `q + 16`, Q8_0 `q + 128`
//! as u8, the unsigned operand of `vpdpbusd`) it is the exact i16 `Σq` that removes the bias.
//! F16 weights take f32 activations rounded to f16 (see `f16x16`).
//!
//! Packing happens only where the kernels exist: every kind with AVX-512 VNNI; all but BF16
//! with AVX2 alone (`vpmaddubsw` + `vpmaddwd` for `vpdpbusd`, 8 rows a register, the same
//! bits). [`PackedWeight::matmul_ref`] is the scalar oracle of the tests.

/// `(kernel::<T, …>, T)` for the largest `T ≤ 8` not above `n` tokens: a tile kernel generic
/// over its token count and the extra const arguments given.
#[cfg(target_arch = "x86_64")]
macro_rules! pick_tile {
    ($n:expr, $($f:ident)::+ $(, $c:expr)*) => {
        match $n {
            8.. => ($($f)::+::<8 $(, $c)*> as TileFn, 8),
            7 => ($($f)::+::<7 $(, $c)*>, 7),
            6 => ($($f)::+::<6 $(, $c)*>, 6),
            5 => ($($f)::+::<5 $(, $c)*>, 5),
            4 => ($($f)::+::<4 $(, $c)*>, 4),
            3 => ($($f)::+::<3 $(, $c)*>, 3),
            2 => ($($f)::+::<2 $(, $c)*>, 2),
            _ => ($($f)::+::<1 $(, $c)*>, 1),
        }
    };
}

mod activations;
#[cfg(target_arch = "x86_64")]
mod avx2_tiles;
mod bf16x16;
mod f16x16;
mod f32x16;
mod nibbles;
#[cfg(target_arch = "x86_64")]
mod prefetch;
mod q4_0x16;
mod q4_1x16;
mod q4_kx16;
mod q5_0x16;
mod q5_1x16;
mod q6_kx16;
mod q8_0x16;
mod reference;
#[cfg(all(test, target_arch = "x86_64"))]
mod tile_twins;
mod transposed;
mod wide;

use std::ops::Range;

use tinynn_core::quant;
use tinynn_format::GgmlType;

use crate::huge_slab::SlabBuf;
use crate::simd::Isa;

// How far ahead the tiles prefetch their weights (a one-token tile: by CPU vendor):
// `prefetch.rs`.
#[cfg(target_arch = "x86_64")]
use prefetch::prefetch_distance;

/// Rows interleaved in one group.
pub const GROUP_ROWS: usize = 16;
/// Bytes of one activation block (Q8_1 layout) of the quantized kinds.
pub const ACT_BLOCK_BYTES: usize = 36;
/// Elements of one packed block of the legacy and float kinds (the K kinds': [`SUPER`]).
const BLOCK: usize = 32;
/// Elements of one K-kind super-block.
const SUPER: usize = 256;
/// Bytes of one Q8_K activation block (f32 d, 256 × i8, 16 × i16 sums).
pub const Q8K_BLOCK_BYTES: usize = 292;

/// The packed layouts (per 32-element block of a 16-row group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PackKind {
    /// From Q4_0: 16 × f16 d, 4 × (16 rows × 4 nibble bytes) = 288 B (18 B a row, as the file).
    Q4_0x16,
    /// From Q4_1: 16 × f16 d, 16 × f16 m, 4 × 64 nibble bytes = 320 B.
    Q4_1x16,
    /// From Q5_0: 16 × f16 d, 8 × u64 bit-planes of the 5th bits, 4 × 64 nibble bytes = 352 B.
    Q5_0x16,
    /// From Q5_1: 16 × f16 d, 16 × f16 m, 8 × u64 bit-planes, 4 × 64 nibble bytes = 384 B.
    Q5_1x16,
    /// From Q8_0: 16 × f16 d, 8 × (16 rows × 4 bytes of q + 128) = 544 B.
    Q8_0x16,
    /// Q8_0x16 whose quants lie within ±63 (`transposed.rs` makes them at AVX2): its AVX2
    /// tile takes them biased by 64 as the unsigned operand, with no sign step.
    Q7_0x16,
    /// From F16: 32 × (16 rows × f16) = 1024 B.
    F16x16,
    /// From BF16: 16 × (16 rows × bf16 pair) = 1024 B (needs AVX-512 BF16).
    Bf16x16,
    /// From F32: 32 × (16 rows × f32) = 2048 B.
    F32x16,
    /// From Q4_K, per 256-element super-block: 16 × f16 d, 16 × f16 dmin, 8 × 16 scales,
    /// 8 × 16 mins (u8), 32 × (16 rows × 4 nibble bytes) = 2368 B (2304 in the file).
    Q4Kx16,
    /// From Q6_K, per super-block: 16 × f16 d, 16 × 16 scales (i8), 64 × (16 rows × 4 bytes
    /// of q + 32) = 4384 B (3360 in the file).
    Q6Kx16,
}

/// How a kind wants its activation rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ActFormat {
    /// Q8_1 blocks with `s = d·Σq` in the 16-bit slot.
    Q8_1,
    /// Q8_1 blocks with the exact i16 `Σq` in the 16-bit slot.
    Q8_1IntSum,
    /// ggml's Q8_K blocks (256 values).
    Q8K,
    /// f32 values rounded to f16 (exactly representable), 4 bytes each.
    F32RoundedF16,
    /// bf16 values, 2 bytes each.
    Bf16,
    /// f32 values as they are, 4 bytes each.
    F32,
}

impl PackKind {
    fn of(ty: GgmlType) -> Option<PackKind> {
        match ty {
            GgmlType::Q4_0 => Some(PackKind::Q4_0x16),
            GgmlType::Q4_1 => Some(PackKind::Q4_1x16),
            GgmlType::Q5_0 => Some(PackKind::Q5_0x16),
            GgmlType::Q5_1 => Some(PackKind::Q5_1x16),
            GgmlType::Q8_0 => Some(PackKind::Q8_0x16),
            GgmlType::F16 => Some(PackKind::F16x16),
            GgmlType::Bf16 => Some(PackKind::Bf16x16),
            GgmlType::F32 => Some(PackKind::F32x16),
            GgmlType::Q4K => Some(PackKind::Q4Kx16),
            GgmlType::Q6K => Some(PackKind::Q6Kx16),
            _ => None,
        }
    }

    /// Bytes of one group's block.
    fn block_bytes(self) -> usize {
        match self {
            PackKind::Q4_0x16 => nibbles::block_bytes(false, false),
            PackKind::Q4_1x16 => nibbles::block_bytes(true, false),
            PackKind::Q5_0x16 => nibbles::block_bytes(false, true),
            PackKind::Q5_1x16 => nibbles::block_bytes(true, true),
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => 544,
            PackKind::F16x16 | PackKind::Bf16x16 => 1024,
            PackKind::F32x16 => 2048,
            PackKind::Q4Kx16 => q4_kx16::BLOCK_BYTES,
            PackKind::Q6Kx16 => q6_kx16::BLOCK_BYTES,
        }
    }

    /// Elements of one block.
    fn block_elems(self) -> usize {
        match self {
            PackKind::Q4Kx16 | PackKind::Q6Kx16 => SUPER,
            _ => BLOCK,
        }
    }

    /// Bytes of one row's block in the file format.
    fn source_block_bytes(self) -> usize {
        match self {
            PackKind::Q4_0x16 => 18,
            PackKind::Q4_1x16 => 20,
            PackKind::Q5_0x16 => 22,
            PackKind::Q5_1x16 => 24,
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => 34,
            PackKind::F16x16 | PackKind::Bf16x16 => 64,
            PackKind::F32x16 => 128,
            PackKind::Q4Kx16 => 144,
            PackKind::Q6Kx16 => 210,
        }
    }

    pub fn activation_format(self) -> ActFormat {
        match self {
            PackKind::Q4_1x16 | PackKind::Q5_1x16 => ActFormat::Q8_1,
            PackKind::Q4_0x16 | PackKind::Q5_0x16 => ActFormat::Q8_1IntSum,
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => ActFormat::Q8_1IntSum,
            PackKind::F16x16 => ActFormat::F32RoundedF16,
            PackKind::Bf16x16 => ActFormat::Bf16,
            PackKind::F32x16 => ActFormat::F32,
            PackKind::Q4Kx16 | PackKind::Q6Kx16 => ActFormat::Q8K,
        }
    }

    fn pack_block(self, src: &[u8], r: usize, dst: &mut [u8]) {
        match self {
            PackKind::Q4_0x16 => q4_0x16::pack_block(src, r, dst),
            PackKind::Q4_1x16 => q4_1x16::pack_block(src, r, dst),
            PackKind::Q5_0x16 => q5_0x16::pack_block(src, r, dst),
            PackKind::Q5_1x16 => q5_1x16::pack_block(src, r, dst),
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => q8_0x16::pack_block(src, r, dst),
            PackKind::F16x16 => f16x16::pack_block(src, r, dst),
            PackKind::Bf16x16 => bf16x16::pack_block(src, r, dst),
            PackKind::F32x16 => f32x16::pack_block(src, r, dst),
            PackKind::Q4Kx16 => q4_kx16::pack_block(src, r, dst),
            PackKind::Q6Kx16 => q6_kx16::pack_block(src, r, dst),
        }
    }

    /// The inverse of [`PackKind::pack_block`]: row `r`'s block in the file's format.
    fn unpack_block(self, src: &[u8], r: usize, dst: &mut [u8]) {
        let d = |dst: &mut [u8]| dst[0..2].copy_from_slice(&src[2 * r..2 * r + 2]);
        let m = |dst: &mut [u8]| dst[2..4].copy_from_slice(&src[nibbles::M_AT + 2 * r..][..2]);
        match self {
            PackKind::Q4_0x16 => {
                d(dst);
                nibbles::unpack_quants(src, false, false, r, &mut dst[2..18]);
            }
            PackKind::Q4_1x16 => {
                d(dst);
                m(dst);
                nibbles::unpack_quants(src, true, false, r, &mut dst[4..20]);
            }
            PackKind::Q5_0x16 => {
                d(dst);
                let qh = nibbles::unpack_quants(src, false, true, r, &mut dst[6..22]);
                dst[2..6].copy_from_slice(&qh.to_le_bytes());
            }
            PackKind::Q5_1x16 => {
                d(dst);
                m(dst);
                let qh = nibbles::unpack_quants(src, true, true, r, &mut dst[8..24]);
                dst[4..8].copy_from_slice(&qh.to_le_bytes());
            }
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => {
                d(dst);
                for j in 0..8 {
                    for i in 0..4 {
                        dst[2 + 4 * j + i] = src[32 + 64 * j + 4 * r + i] ^ 0x80;
                    }
                }
            }
            PackKind::F16x16 => {
                for i in 0..32 {
                    dst[2 * i..][..2].copy_from_slice(&src[32 * i + 2 * r..][..2]);
                }
            }
            PackKind::Bf16x16 => {
                for p in 0..16 {
                    dst[4 * p..][..4].copy_from_slice(&src[64 * p + 4 * r..][..4]);
                }
            }
            PackKind::F32x16 => f32x16::unpack_block(src, r, dst),
            PackKind::Q4Kx16 => q4_kx16::unpack_block(src, r, dst),
            PackKind::Q6Kx16 => q6_kx16::unpack_block(src, r, dst),
        }
    }

    /// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
    fn dot_ref(self, w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
        match self {
            PackKind::Q4_0x16 => q4_0x16::dot_ref(w, nb, r, x),
            PackKind::Q4_1x16 => q4_1x16::dot_ref(w, nb, r, x),
            PackKind::Q5_0x16 => q5_0x16::dot_ref(w, nb, r, x),
            PackKind::Q5_1x16 => q5_1x16::dot_ref(w, nb, r, x),
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => q8_0x16::dot_ref(w, nb, r, x),
            PackKind::F16x16 => f16x16::dot_ref(w, nb, r, x),
            PackKind::Bf16x16 => bf16x16::dot_ref(w, nb, r, x),
            PackKind::F32x16 => f32x16::dot_ref(w, nb, r, x),
            PackKind::Q4Kx16 => q4_kx16::dot_ref(w, nb, r, x),
            PackKind::Q6Kx16 => q6_kx16::dot_ref(w, nb, r, x),
        }
    }

    /// Most tokens of one tile: F16's has no unpacking to share and needs more independent
    /// FMAs per weight load; the quantized kinds' unpacked weights fill half the registers.
    fn max_tile(self) -> usize {
        match self {
            PackKind::F16x16 | PackKind::Bf16x16 | PackKind::F32x16 => 16,
            _ => 8,
        }
    }

    /// The two-group kernel of the kinds that have one, for at least 8 of `n` tokens, and
    /// how many tokens it takes.
    #[cfg(target_arch = "x86_64")]
    fn tile_pair_fn(self) -> Option<fn(usize) -> (PairFn, usize)> {
        fn f32s(n: usize) -> (PairFn, usize) {
            match n {
                12.. => (wide::tile_pair::<12, true>, 12),
                _ => (wide::tile_pair::<8, true>, 8),
            }
        }
        fn f16s(n: usize) -> (PairFn, usize) {
            match n {
                12.. => (wide::tile_pair::<12, false>, 12),
                _ => (wide::tile_pair::<8, false>, 8),
            }
        }
        match self {
            _ if !wide() => None,
            PackKind::F32x16 => Some(f32s),
            PackKind::F16x16 => Some(f16s),
            _ => None,
        }
    }

    /// Whether the kind has an AVX2 tile (packed where AVX-512 VNNI is absent).
    fn has_avx2_tile(self) -> bool {
        matches!(
            self,
            PackKind::Q4_0x16
                | PackKind::Q4_1x16
                | PackKind::Q5_0x16
                | PackKind::Q5_1x16
                | PackKind::Q8_0x16
                | PackKind::Q7_0x16
                | PackKind::Q4Kx16
                | PackKind::Q6Kx16
                | PackKind::F16x16
                | PackKind::F32x16
        )
    }

    /// The SIMD kernel for a tile of at most `n` (1..=`max_tile`) tokens and how many it takes.
    #[cfg(target_arch = "x86_64")]
    fn tile(self, n: usize) -> (TileFn, usize) {
        if !wide() {
            return self.tile_avx2(n);
        }
        match self {
            PackKind::Q4_0x16 => pick_tile!(n, nibbles::tile, false, false, 8),
            PackKind::Q4_1x16 => pick_tile!(n, nibbles::tile, true, false, 0),
            PackKind::Q5_0x16 => pick_tile!(n, nibbles::tile, false, true, 16),
            PackKind::Q5_1x16 => pick_tile!(n, nibbles::tile, true, true, 0),
            PackKind::Q8_0x16 | PackKind::Q7_0x16 => pick_tile!(n, q8_0x16::tile),
            PackKind::F16x16 => match n {
                16.. => (wide::tile::<16, false>, 16),
                12.. => (wide::tile::<12, false>, 12),
                _ => pick_tile!(n, wide::tile, false),
            },
            PackKind::Bf16x16 => match n {
                16.. => (bf16x16::tile::<16>, 16),
                12.. => (bf16x16::tile::<12>, 12),
                _ => pick_tile!(n, bf16x16::tile),
            },
            PackKind::F32x16 => match n {
                16.. => (wide::tile::<16, true>, 16),
                12.. => (wide::tile::<12, true>, 12),
                _ => pick_tile!(n, wide::tile, true),
            },
            PackKind::Q4Kx16 => pick_tile!(n, q4_kx16::tile),
            PackKind::Q6Kx16 => pick_tile!(n, q6_kx16::tile),
        }
    }
}

/// A two-group tile kernel ([`wide::tile_pair`]): `(group, gb, x, x_stride, out, out_stride,
/// valid_b)`.
#[cfg(target_arch = "x86_64")]
type PairFn = unsafe fn(GroupIn, usize, *const u8, usize, *mut f32, usize, usize);

/// A tile kernel: `(group, x, x_stride, out, out_stride, valid)` computes `T` tokens
/// (activation rows at `x + t·x_stride`) against one group, storing the `valid` first of the
/// 16 columns at `out + t·out_stride` (f32s).
///
/// Safety of a call: the instructions of the kernel are present, the group, the activation
/// rows and the output columns are in bounds, and no other thread writes those columns.
#[cfg(target_arch = "x86_64")]
type TileFn = unsafe fn(GroupIn, *const u8, usize, *mut f32, usize, usize);

/// The weights a tile reads: a group's `nb` blocks at `w`, prefetched `pf` bytes ahead of
/// the block being read (0: no prefetch).
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct GroupIn {
    w: *const u8,
    nb: usize,
    pf: usize,
}

/// The store mask of the `valid` first lanes.
#[cfg(target_arch = "x86_64")]
/// Stores, for each of `T` tokens, the sum over `sets` of its accumulators (`sets[s][t]`, 16
/// rows each) into the first `valid` columns of its output row (`out + t·out_stride`).
///
/// # Safety
/// AVX-512F present; those columns of the `T` output rows are writable and the caller's.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn store_summed<const T: usize>(
    sets: &[[std::arch::x86_64::__m512; T]],
    out: *mut f32,
    out_stride: usize,
    valid: usize,
) {
    use std::arch::x86_64::*;
    let mask = lanes(valid);
    for t in 0..T {
        let mut sum = sets[0][t];
        for s in &sets[1..] {
            sum = _mm512_add_ps(sum, s[t]);
        }
        // SAFETY: the `valid` columns of token t's output row are writable (caller).
        unsafe { _mm512_mask_storeu_ps(out.add(t * out_stride), mask, sum) };
    }
}

fn lanes(valid: usize) -> u16 {
    if valid >= 16 {
        0xFFFF
    } else {
        (1u16 << valid) - 1
    }
}

/// A 2-D weight `[k, n_rows]` in a packed layout.
pub struct PackedWeight {
    kind: PackKind,
    source: GgmlType,
    k: usize,
    n_rows: usize,
    /// In huge-page-backed memory: decode streams it from DRAM (see `huge_slab`).
    data: SlabBuf,
    /// For a frozen training weight: its transpose for `mul_mat_t` (`transposed.rs`).
    backward: Option<Box<PackedWeight>>,
}

/// Whether this machine runs packed kernels (AVX2 + FMA + F16C at least, and `TINYNN_ISA`
/// does not cap it lower); which kinds, [`packs`] says.
pub fn available() -> bool {
    Isa::detected() >= Isa::Avx2
}

/// Whether every kind's kernel runs (AVX-512 VNNI), rather than the AVX2 ones.
fn wide() -> bool {
    Isa::detected() >= Isa::Avx512Vnni
}

/// Whether [`pack`] packs weights of type `ty` on this machine (shape permitting).
pub fn packs(ty: GgmlType) -> bool {
    available()
        && PackKind::of(ty).is_some_and(|k| {
            (wide() || k.has_avx2_tile()) && (k != PackKind::Bf16x16 || bf16x16::available())
        })
}

/// Packs weight `bytes` of type `ty` and shape `ne` (contiguous rows), or `None` when the type
/// or shape has no packed kernel or this machine lacks the instructions.
pub fn pack(ty: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<PackedWeight> {
    if !packs(ty) {
        return None;
    }
    pack_always(ty, ne, bytes)
}

/// [`pack`] without the instruction-set check (tests of the layout and reference run anywhere).
pub fn pack_always(ty: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<PackedWeight> {
    let kind = PackKind::of(ty)?;
    let [k, n_rows, n2, n3] = ne;
    let be = kind.block_elems();
    if n2 != 1 || n3 != 1 || k == 0 || n_rows == 0 || !k.is_multiple_of(be) {
        return None;
    }
    let row_bytes = quant::row_bytes(ty, k).ok()?;
    if bytes.len() != row_bytes.checked_mul(n_rows)? {
        return None;
    }
    let (nb, bb, sb) = (k / be, kind.block_bytes(), kind.source_block_bytes());
    debug_assert_eq!(nb * sb, row_bytes);
    let n_groups = n_rows.div_ceil(GROUP_ROWS);
    // No packed copy (the file's layout serves) when the memory is refused.
    let mut data = SlabBuf::try_zeroed(n_groups * nb * bb).ok()?;
    let out = data.as_bytes_mut();
    for g in 0..n_groups {
        for r in 0..GROUP_ROWS.min(n_rows - g * GROUP_ROWS) {
            let row = &bytes[(g * GROUP_ROWS + r) * row_bytes..][..row_bytes];
            for b in 0..nb {
                let dst = &mut out[(g * nb + b) * bb..][..bb];
                kind.pack_block(&row[b * sb..][..sb], r, dst);
            }
        }
    }
    Some(PackedWeight {
        kind,
        source: ty,
        k,
        n_rows,
        data,
        backward: None,
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

    /// Bytes the packed copy occupies (with its transpose, if it has one).
    pub fn bytes(&self) -> usize {
        self.data.len() + self.backward.as_ref().map_or(0, |b| b.bytes())
    }

    /// Bytes of one row in the file's format.
    pub fn row_bytes(&self) -> usize {
        self.n_blocks() * self.kind.source_block_bytes()
    }

    /// Blocks of a row (32 or 256 elements each, by kind).
    fn n_blocks(&self) -> usize {
        self.k / self.kind.block_elems()
    }

    /// Writes row `n` back in the file's format (`row_bytes()` bytes into `out`): the bytes
    /// it was packed from, so a packed copy can stand in for them.
    pub fn unpack_row(&self, n: usize, out: &mut [u8]) {
        assert!(n < self.n_rows && out.len() == self.row_bytes());
        let (nb, bb, sb) = (
            self.n_blocks(),
            self.kind.block_bytes(),
            self.kind.source_block_bytes(),
        );
        let (g, r) = (n / GROUP_ROWS, n % GROUP_ROWS);
        for b in 0..nb {
            let src = &self.data.as_bytes()[(g * nb + b) * bb..][..bb];
            self.kind.unpack_block(src, r, &mut out[b * sb..][..sb]);
        }
    }

    /// Dequantizes row `n` into `out` (`k` values) exactly as the file's format does, one
    /// unpacked block at a time; false if the format has no dequantizer.
    pub fn dequantize_row(&self, n: usize, out: &mut [f32]) -> bool {
        if n >= self.n_rows || out.len() != self.k {
            return false;
        }
        let (nb, bb, sb) = (
            self.n_blocks(),
            self.kind.block_bytes(),
            self.kind.source_block_bytes(),
        );
        let be = self.kind.block_elems();
        let (g, r) = (n / GROUP_ROWS, n % GROUP_ROWS);
        if matches!(self.kind, PackKind::Q8_0x16 | PackKind::Q7_0x16) {
            q8_0x16::dequantize_row(&self.data.as_bytes()[g * nb * bb..][..nb * bb], r, out);
            return true;
        }
        // Rows up to 4 KiB are unpacked whole and dequantized in one call.
        let mut row = [0u8; 4096];
        if let Some(row) = row.get_mut(..nb * sb) {
            for b in 0..nb {
                let src = &self.data.as_bytes()[(g * nb + b) * bb..][..bb];
                self.kind.unpack_block(src, r, &mut row[b * sb..][..sb]);
            }
            return quant::dequantize_row(self.source, row, out).is_ok();
        }
        let mut block = [0u8; 256];
        for b in 0..nb {
            let src = &self.data.as_bytes()[(g * nb + b) * bb..][..bb];
            self.kind.unpack_block(src, r, &mut block[..sb]);
            let vals = &mut out[b * be..][..be];
            if quant::dequantize_row(self.source, &block[..sb], vals).is_err() {
                return false;
            }
        }
        true
    }

    pub fn n_groups(&self) -> usize {
        self.n_rows.div_ceil(GROUP_ROWS)
    }

    /// `out[t·out_stride + n] = Σ_k w[n, k] · x_t[k]` for tokens `t < m` and the rows of
    /// `groups`, with `x_t` the prepared activation row at `acts[t·act_stride..]`.
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
        let nb = self.n_blocks();
        let gb = nb * self.kind.block_bytes();
        let mut groups = groups;
        #[cfg(target_arch = "x86_64")]
        if m >= 8 {
            // Prefill of the float kinds: two groups at a time (the last one, and the tokens
            // below 8, by the one-group tiles below).
            if let Some(pair) = self.kind.tile_pair_fn() {
                while groups.len() >= 2 {
                    let g = groups.start;
                    let w = &self.data.as_bytes()[g * gb..][..2 * gb];
                    let valid_b = GROUP_ROWS.min(self.n_rows - (g + 1) * GROUP_ROWS);
                    let mut t = 0;
                    while m - t >= 8 {
                        let (tile, n) = pair(m - t);
                        // SAFETY: forwarded from the caller: tokens t..t+n exist, the two
                        // groups' columns start at g·16 (the first whole, as another follows).
                        unsafe {
                            tile(
                                GroupIn {
                                    w: w.as_ptr(),
                                    nb,
                                    pf: prefetch_distance(n, t == 0),
                                },
                                gb,
                                acts.add(t * act_stride),
                                act_stride,
                                out.add(g * GROUP_ROWS + t * out_stride),
                                out_stride,
                                valid_b,
                            )
                        };
                        t += n;
                    }
                    if t < m {
                        // SAFETY: as for this call, for the remaining tokens.
                        unsafe {
                            self.matmul_raw(
                                acts.add(t * act_stride),
                                act_stride,
                                m - t,
                                out.add(t * out_stride),
                                out_stride,
                                g..g + 2,
                            )
                        };
                    }
                    groups.start += 2;
                }
            }
        }
        for g in groups {
            let w = &self.data.as_bytes()[g * gb..][..gb];
            let valid = GROUP_ROWS.min(self.n_rows - g * GROUP_ROWS);
            let mut t = 0;
            while t < m {
                // A kind with a pair tile cuts m ≥ 8 tokens as the pair tile does, so a group
                // gets the same bits alone as in a pair (only tiles below 5 tokens sum in
                // another order), however the groups are shared out.
                #[cfg(target_arch = "x86_64")]
                let most = match self.kind.tile_pair_fn() {
                    Some(pair) if m - t >= 8 => pair(m - t).1,
                    _ => self.kind.max_tile(),
                };
                #[cfg(target_arch = "x86_64")]
                let (tile, n) = self.kind.tile((m - t).min(most));
                #[cfg(not(target_arch = "x86_64"))]
                let n = (m - t).min(self.kind.max_tile());
                // SAFETY: forwarded from the caller: tokens t..t+n exist, the group's columns
                // start at g·16; packing (hence this call) implies the kernels' instructions.
                unsafe {
                    let (x, o) = (
                        acts.add(t * act_stride),
                        out.add(g * GROUP_ROWS + t * out_stride),
                    );
                    #[cfg(target_arch = "x86_64")]
                    tile(
                        GroupIn {
                            w: w.as_ptr(),
                            nb,
                            pf: prefetch_distance(n, t == 0),
                        },
                        x,
                        act_stride,
                        o,
                        out_stride,
                        valid,
                    );
                    #[cfg(not(target_arch = "x86_64"))]
                    for i in 0..n {
                        // Never packed off x86 (see `available`); the reference stays correct.
                        let xs = std::slice::from_raw_parts(
                            x.add(i * act_stride),
                            self.activation_row_bytes(),
                        );
                        for r in 0..valid {
                            *o.add(i * out_stride + r) = self.kind.dot_ref(w, nb, r, xs);
                        }
                    }
                }
                t += n;
            }
        }
    }

    /// The whole product with the fastest kernel: `acts` is `m` activation rows back to back,
    /// `out` is `m × n_rows`.
    pub fn matmul(&self, acts: &[u8], m: usize, out: &mut [f32]) {
        self.matmul_groups(acts, m, out, 0..self.n_groups());
    }

    /// [`PackedWeight::matmul`] for the 16-row groups `groups` only (their columns of `out`),
    /// as a thread computes its share.
    pub fn matmul_groups(&self, acts: &[u8], m: usize, out: &mut [f32], groups: Range<usize>) {
        assert!(
            available() && (wide() || self.kind.has_avx2_tile()),
            "no packed kernel for {:?} on this CPU",
            self.kind
        );
        assert!(self.kind != PackKind::Bf16x16 || bf16x16::available());
        assert_eq!(acts.len(), m * self.activation_row_bytes());
        assert_eq!(out.len(), m * self.n_rows);
        assert!(groups.start <= groups.end && groups.end <= self.n_groups());
        // SAFETY: sizes and groups checked above; one thread writes everything.
        unsafe {
            self.matmul_raw(
                acts.as_ptr(),
                self.activation_row_bytes(),
                m,
                out.as_mut_ptr(),
                self.n_rows,
                groups,
            )
        }
    }
}

/// The f16 at `b[0..2]`.
fn f16_at(b: &[u8]) -> f32 {
    half::f16::from_le_bytes([b[0], b[1]]).to_f32()
}
