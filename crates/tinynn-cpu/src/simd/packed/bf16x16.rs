//! BF16 × 16 rows. Group block (1024 B) of 32 elements: for each pair `p` of elements the 16
//! rows' bf16 pairs `(w[2p], w[2p + 1])` side by side (64 B), the operand layout of
//! `vdpbf16ps` (AVX-512 BF16), which multiplies them with a broadcast activation pair and adds
//! both products to the row's f32 sum.
//!
//! Activations are bf16 (ggml's dot type for BF16; rounded as `quant::half::f32_to_bf16`).
//! Products of two bf16s are exact in f32; `vdpbf16ps` treats denormal inputs as zero, which
//! bf16 weights and activations of a model do not hold in practice.

use tinynn_core::quant::half;

/// Writes row `r`'s 32 bf16 weights (64 B) into a group block.
pub(super) fn pack_block(src: &[u8], r: usize, dst: &mut [u8]) {
    for p in 0..16 {
        dst[64 * p + 4 * r..][..4].copy_from_slice(&src[4 * p..][..4]);
    }
}

/// Row `r` of a group (`nb` blocks at `w`) · activation row `x`, from the packed bytes.
pub(super) fn dot_ref(w: &[u8], nb: usize, r: usize, x: &[u8]) -> f32 {
    let bf = |b: &[u8]| half::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    let mut acc = 0f32;
    for e in 0..nb * 32 {
        acc += bf(&w[64 * (e / 2) + 4 * r + 2 * (e % 2)..]) * bf(&x[2 * e..]);
    }
    acc
}

/// Whether this machine has `vdpbf16ps`.
pub(super) fn available() -> bool {
    crate::simd::Isa::detected() >= crate::simd::Isa::Avx512Bf16
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx512::tile;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `T` tokens × 16 rows over `nb` blocks of 32 elements (16 pairs). Small tiles (decode)
    /// spread the pairs over several accumulators so the instruction latency does not bound
    /// them.
    ///
    /// # Safety
    /// AVX-512 F + BF16 present; pointers as in `super::super::TileFn`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(in super::super) unsafe fn tile<const T: usize>(
        group: super::super::GroupIn,
        x: *const u8,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
        valid: usize,
    ) {
        let super::super::GroupIn { w, nb, pf } = group;
        let sets = match T {
            1 | 2 => 4,
            3 | 4 => 2,
            _ => 1,
        };
        let mut f = [[_mm512_setzero_ps(); T]; 4];
        let mut p = 0;
        while p < nb * 16 {
            if pf != 0 {
                // Streaming the group from memory: ask for this step's bytes (64·sets) `pf`
                // bytes ahead.
                crate::simd::prefetch(w.wrapping_add(64 * p + pf), 64 * sets);
            }
            for (s, fs) in f.iter_mut().enumerate().take(sets) {
                // SAFETY: pair p + s < nb·16 (sets divides 16) of the group and of every token
                // row is in bounds (caller); the transmutes reinterpret 512 bits of bf16 pairs,
                // the operand type of the instruction.
                unsafe {
                    let wv: __m512bh = std::mem::transmute(_mm512_loadu_si512(
                        w.add(64 * (p + s)) as *const __m512i
                    ));
                    for (t, ft) in fs.iter_mut().enumerate() {
                        let xp = (x.add(t * x_stride + 4 * (p + s)) as *const i32).read_unaligned();
                        let xv: __m512bh = std::mem::transmute(_mm512_set1_epi32(xp));
                        *ft = _mm512_dpbf16_ps(*ft, wv, xv);
                    }
                }
            }
            p += sets;
        }
        // SAFETY: the `valid` columns of every token's output row are this thread's (caller).
        unsafe { super::super::store_summed(&f[..sets], out, out_stride, valid) };
    }
}
