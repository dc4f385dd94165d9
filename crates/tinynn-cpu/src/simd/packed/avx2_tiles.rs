//! Which AVX2 tile runs a packed kind where AVX-512 VNNI is absent (every kind but BF16): the
//! 4- and 5-bit kinds and Q8_0 up to 8 tokens, the K kinds up to 4 (their sums stay in
//! registers), the float kinds up to [`wide::AVX2_MAX_TOKENS`].

use super::{nibbles, q4_kx16, q6_kx16, q8_0x16, wide, PackKind, TileFn};

impl PackKind {
    /// The AVX2 kernel for a tile of at most `n` tokens and how many it takes.
    pub(super) fn tile_avx2(self, n: usize) -> (TileFn, usize) {
        match self {
            PackKind::Q4_0x16 => pick_tile!(n, nibbles::tile_avx2, false, false, 8),
            PackKind::Q4_1x16 => pick_tile!(n, nibbles::tile_avx2, true, false, 0),
            PackKind::Q5_0x16 => pick_tile!(n, nibbles::tile_avx2, false, true, 16),
            PackKind::Q5_1x16 => pick_tile!(n, nibbles::tile_avx2, true, true, 0),
            PackKind::Q8_0x16 => pick_tile!(n, q8_0x16::tile_avx2, false),
            PackKind::Q7_0x16 => pick_tile!(n, q8_0x16::tile_avx2, true),
            PackKind::Q4Kx16 => pick_tile!(n.min(4), q4_kx16::tile_avx2),
            PackKind::Q6Kx16 => pick_tile!(n.min(4), q6_kx16::tile_avx2),
            PackKind::F16x16 => pick_tile!(n.min(wide::AVX2_MAX_TOKENS), wide::tile_avx2, false),
            PackKind::F32x16 => pick_tile!(n.min(wide::AVX2_MAX_TOKENS), wide::tile_avx2, true),
            PackKind::Bf16x16 => unreachable!("BF16 is packed only with AVX-512 BF16"),
        }
    }
}
