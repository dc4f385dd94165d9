//! Activation rows to Q8_1 blocks for the packed matrix kernels, with AVX-512: the same
//! arithmetic as `tinynn_core::quant::quantize_activations(Q8_1, ..)` (scale `amax / 127`,
//! quants `round_ties_even(x · 127 / amax)`, `s = d · Σq`), so results are bit-identical.
//! With `int_sum` the 16-bit slot holds the exact `Σq` as i16 instead (packed Q8_0).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use tinynn_core::quant::{self, half};
use tinynn_format::GgmlType;

/// Quantizes `x` (whole 32-value blocks) into `out` (36 bytes a block).
pub fn q8_1_row(x: &[f32], out: &mut [u8], int_sum: bool) {
    assert!(x.len().is_multiple_of(32) && out.len() == x.len() / 32 * 36);
    #[cfg(target_arch = "x86_64")]
    if super::vexp::available() {
        // SAFETY: AVX-512F/BW checked; sizes asserted above.
        unsafe { q8_1_avx512(x, out, int_sum) };
        return;
    }
    // AVX2 (or the reference): the same bytes; the exact sums are then read off the quants.
    q8_activations(GgmlType::Q8_1, x, out).expect("sizes asserted above");
    if int_sum {
        for blk in out.chunks_exact_mut(36) {
            let sum: i32 = blk[4..].iter().map(|&q| i32::from(q as i8)).sum();
            blk[2..4].copy_from_slice(&(sum as i16).to_le_bytes());
        }
    }
}

/// `x` (whole 32-value blocks) into Q8_0 (34 bytes a block) or Q8_1 (36) blocks in `out`, bit
/// for bit as `quant::quantize_activations` (NaN quantizes to 0 and leaves the scale alone, an
/// infinity makes the block's quants 0), with AVX2 where present (the unpacked matrix
/// products' activations). Other types, or sizes that do not match, go to the reference,
/// whose error is returned.
pub fn q8_activations(ty: GgmlType, x: &[f32], out: &mut [u8]) -> Result<(), quant::QuantError> {
    let bytes = match ty {
        GgmlType::Q8_0 => 34,
        GgmlType::Q8_1 => 36,
        _ => 0,
    };
    #[cfg(target_arch = "x86_64")]
    if bytes > 0
        && super::Isa::detected() >= super::Isa::Avx2
        && x.len().is_multiple_of(32)
        && out.len() == x.len() / 32 * bytes
    {
        for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(bytes)) {
            // SAFETY: AVX2 and F16C checked; 32 values, one block's bytes.
            unsafe { q8_block_avx2(xb, ob, bytes == 36) };
        }
        return Ok(());
    }
    quant::quantize_activations(ty, x, out)
}

/// One Q8_0 / Q8_1 block (`q8_1`: the 36-byte layout with `s = d·Σq`).
///
/// # Safety
/// AVX2 + F16C; `x` holds 32 values, `out` the block's bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
unsafe fn q8_block_avx2(x: &[f32], out: &mut [u8], q8_1: bool) {
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY: 4 loads of 8 within x's 32 (caller).
    let v: [__m256; 4] = std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    // |v| maxima; vmaxps returns its second operand when the first is NaN, so a NaN value is
    // skipped as f32::max skips it.
    let mut m = _mm256_setzero_ps();
    for vi in &v {
        m = _mm256_max_ps(_mm256_andnot_ps(sign, *vi), m);
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let idv = _mm256_set1_ps(id);
    const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    let q: [__m256i; 4] = v.map(|vi| {
        let p = _mm256_mul_ps(vi, idv);
        // `NaN as i8` is 0 in the reference; vcvtps2dq would give i32::MIN.
        let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(p, p));
        _mm256_andnot_si256(nan, _mm256_cvtps_epi32(_mm256_round_ps::<R>(p)))
    });
    let s4 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s2 = _mm_add_epi32(
        _mm256_castsi256_si128(s4),
        _mm256_extracti128_si256::<1>(s4),
    );
    let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32::<0b01_00_11_10>(s2));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s1, _mm_shuffle_epi32::<0b10_11_00_01>(s1)));
    // i32 -> i16 -> i8 (values within ±127), packs work per 128-bit half: reorder the dwords.
    let w01 = _mm256_packs_epi32(q[0], q[1]);
    let w23 = _mm256_packs_epi32(q[2], q[3]);
    let b = _mm256_packs_epi16(w01, w23);
    let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let d = amax / 127.0;
    let at = if q8_1 { 4 } else { 2 };
    // SAFETY: 32 quants at `at`, inside the block (caller).
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().add(at) as *mut __m256i, b) };
    out[0..2].copy_from_slice(&f16_bits(d).to_le_bytes());
    if q8_1 {
        out[2..4].copy_from_slice(&f16_bits(d * sum as f32).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
unsafe fn q8_1_avx512(x: &[f32], out: &mut [u8], int_sum: bool) {
    let sign = _mm512_set1_ps(-0.0);
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(36)) {
        // SAFETY: 32 f32s in xb, 36 bytes in ob.
        unsafe {
            let a = _mm512_loadu_ps(xb.as_ptr());
            let b = _mm512_loadu_ps(xb.as_ptr().add(16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(
                _mm512_andnot_ps(sign, a),
                _mm512_andnot_ps(sign, b),
            ));
            let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
            let d = amax / 127.0;
            let idv = _mm512_set1_ps(id);
            const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
            let qa = _mm512_cvtps_epi32(_mm512_roundscale_ps::<R>(_mm512_mul_ps(a, idv)));
            let qb = _mm512_cvtps_epi32(_mm512_roundscale_ps::<R>(_mm512_mul_ps(b, idv)));
            let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(qa, qb));
            _mm_storeu_si128(
                ob.as_mut_ptr().add(4) as *mut __m128i,
                _mm512_cvtepi32_epi8(qa),
            );
            _mm_storeu_si128(
                ob.as_mut_ptr().add(20) as *mut __m128i,
                _mm512_cvtepi32_epi8(qb),
            );
            ob[0..2].copy_from_slice(&f16_bits(d).to_le_bytes());
            let slot = if int_sum {
                sum as i16 as u16
            } else {
                f16_bits(d * sum as f32)
            };
            ob[2..4].copy_from_slice(&slot.to_le_bytes());
        }
    }
}

/// `x` as f16 bits, rounded to nearest even (as `half::f32_to_f16`), inline: the `half`
/// crate's call detects F16C at run time each time, a tenth of the quantizer's cost.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
fn f16_bits(x: f32) -> u16 {
    _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) as u16
}

/// `dst[i] = f16(src[i])` (round to nearest even, as `half::f32_to_f16`), F16C when present.
///
/// # Safety
/// `src` holds `n` f32s and `dst` room for `n` f16s; they do not overlap.
pub(crate) unsafe fn f32_to_f16_row(src: *const f32, dst: *mut u8, n: usize) {
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if super::vexp::available() {
        // SAFETY: AVX-512F checked; pointers from the caller.
        i = unsafe { f32_to_f16_avx512(src, dst, n) };
    } else if super::Isa::detected() >= super::Isa::Avx2 {
        // SAFETY: F16C checked (part of the AVX2 level); pointers from the caller.
        i = unsafe { f32_to_f16_f16c(src, dst, n) };
    }
    for j in i..n {
        // SAFETY: j < n.
        unsafe {
            let h = half::f32_to_f16(src.add(j).read_unaligned());
            (dst.add(2 * j) as *mut u16).write_unaligned(h);
        }
    }
}

/// `x` rounded to f16 (nearest even): the f16s into `q16` (little-endian) and their values
/// back into `q32`.
pub(crate) fn round_to_f16(x: &[f32], q32: &mut [f32], q16: &mut [u8]) {
    assert!(q32.len() == x.len() && q16.len() == 2 * x.len());
    // SAFETY: x.len() values and 2·x.len() bytes (asserted above); distinct borrows.
    unsafe { f32_to_f16_row(x.as_ptr(), q16.as_mut_ptr(), x.len()) };
    for (v, h) in q32.iter_mut().zip(q16.chunks_exact(2)) {
        *v = half::f16_to_f32(u16::from_le_bytes([h[0], h[1]]));
    }
}

/// [`f32_to_f16_avx512`] 8 values at a time.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f32_to_f16_f16c(src: *const f32, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 8 values at each pointer.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
            _mm_storeu_si128(dst.add(2 * i) as *mut __m128i, h);
        }
        i += 8;
    }
    i
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn f32_to_f16_avx512(src: *const f32, dst: *mut u8, n: usize) -> usize {
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: 16 values at each pointer.
        unsafe {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_loadu_ps(src.add(i)),
            );
            _mm256_storeu_si256(dst.add(2 * i) as *mut __m256i, h);
        }
        i += 16;
    }
    i
}

/// `out` (4 bytes a value) = `x` rounded to the nearest f16 (ties to even), as f32: the
/// activations of packed F16 weights.
pub fn round_f16_row(x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), x.len() * 4);
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if super::vexp::available() {
        // SAFETY: AVX-512F checked; sizes asserted above.
        i = unsafe { round_f16_avx512(x, out) };
    } else if super::Isa::detected() >= super::Isa::Avx2 {
        // SAFETY: F16C checked (part of the AVX2 level); sizes asserted above.
        i = unsafe { round_f16_f16c(x, out) };
    }
    for (v, o) in x[i..].iter().zip(out[4 * i..].chunks_exact_mut(4)) {
        o.copy_from_slice(&half::f16_to_f32(half::f32_to_f16(*v)).to_le_bytes());
    }
}

/// [`round_f16_avx512`] 8 values at a time (the same conversions).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn round_f16_f16c(x: &[f32], out: &mut [u8]) -> usize {
    let mut i = 0;
    while i + 8 <= x.len() {
        // SAFETY: 8 values from i in x, 32 bytes from 4i in out (sizes from the caller).
        unsafe {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_ps(out.as_mut_ptr().add(4 * i) as *mut f32, _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    i
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn round_f16_avx512(x: &[f32], out: &mut [u8]) -> usize {
    let mut i = 0;
    while i + 16 <= x.len() {
        // SAFETY: 16 values from i in x, 64 bytes from 4i in out (sizes from the caller).
        unsafe {
            let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
                _mm512_loadu_ps(x.as_ptr().add(i)),
            );
            _mm512_storeu_ps(out.as_mut_ptr().add(4 * i) as *mut f32, _mm512_cvtph_ps(h));
        }
        i += 16;
    }
    i
}

/// `out` (2 bytes a value) = `x` as bf16, rounded as `half::f32_to_bf16` (ggml's rounding:
/// nearest even, NaN kept quiet): the activations of packed BF16 weights.
pub fn bf16_row(x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), x.len() * 2);
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if super::vexp::available() {
        // SAFETY: AVX-512F checked; sizes asserted above.
        i = unsafe { bf16_avx512(x, out) };
    }
    for (v, o) in x[i..].iter().zip(out[2 * i..].chunks_exact_mut(2)) {
        o.copy_from_slice(&half::f32_to_bf16(*v).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn bf16_avx512(x: &[f32], out: &mut [u8]) -> usize {
    let (abs, inf) = (
        _mm512_set1_epi32(0x7fff_ffff),
        _mm512_set1_epi32(0x7f80_0000),
    );
    let (half_ulp, one, quiet) = (
        _mm512_set1_epi32(0x7fff),
        _mm512_set1_epi32(1),
        _mm512_set1_epi32(64),
    );
    let mut i = 0;
    while i + 16 <= x.len() {
        // SAFETY: 16 values from i in x, 32 bytes from 2i in out (sizes from the caller).
        unsafe {
            let u = _mm512_loadu_si512(x.as_ptr().add(i) as *const __m512i);
            let odd = _mm512_and_si512(_mm512_srli_epi32::<16>(u), one);
            let rounded = _mm512_add_epi32(u, _mm512_add_epi32(half_ulp, odd));
            let nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs), inf);
            let v = _mm512_mask_or_epi32(rounded, nan, u, _mm512_slli_epi32::<16>(quiet));
            let h = _mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(v));
            _mm256_storeu_si256(out.as_mut_ptr().add(2 * i) as *mut __m256i, h);
        }
        i += 16;
    }
    i
}

/// ggml's Q8_K blocks of `x` (a whole number of 256-value blocks) into `out` (292 bytes a
/// block), bit for bit as `tinynn_core::quant`'s reference: the scale from the value of
/// largest magnitude (the first such, with its sign), `q = round_even(−127/max · v)` capped at
/// 127, the 16-value sums, `d = 1/iscale`. AVX-512 when present; a block with a non-finite
/// value goes through the reference.
pub fn q8_k_row(x: &[f32], out: &mut [u8]) {
    assert!(x.len().is_multiple_of(256) && out.len() == x.len() / 256 * 292);
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        #[cfg(target_arch = "x86_64")]
        if super::vexp::available() && xb.iter().all(|v| v.is_finite()) {
            // SAFETY: AVX-512F/BW checked; 256 values and 292 bytes.
            unsafe { q8_k_block_avx512(xb, ob) };
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        if super::Isa::detected() >= super::Isa::Avx2 && xb.iter().all(|v| v.is_finite()) {
            // SAFETY: AVX2 checked; 256 values and 292 bytes.
            unsafe { q8_k_block_avx2(xb, ob) };
            continue;
        }
        quant::quantize_activations(GgmlType::Q8K, xb, ob).expect("one whole block");
    }
}

/// [`q8_k_block_avx512`] with AVX2: the same scale, roundings, cap and sums.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn q8_k_block_avx2(x: &[f32], out: &mut [u8]) {
    let sign = _mm256_set1_ps(-0.0);
    // SAFETY: 32 loads of 8 values within x's 256 (caller).
    let v: [__m256; 32] =
        std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * i)) });
    let mut m = _mm256_setzero_ps();
    for vi in &v {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps::<1>(m2, m2)));
    if amax == 0.0 {
        out.fill(0);
        return;
    }
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    let sv = _mm256_set1_ps(iscale);
    let cap = _mm256_set1_epi32(127);
    const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for g in 0..16 {
        let q = [0, 1].map(|k| {
            let p = _mm256_mul_ps(v[2 * g + k], sv);
            _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_round_ps::<R>(p)), cap)
        });
        let s8 = _mm256_add_epi32(q[0], q[1]);
        let s4 = _mm_add_epi32(
            _mm256_castsi256_si128(s8),
            _mm256_extracti128_si256::<1>(s8),
        );
        let s2 = _mm_add_epi32(s4, _mm_shuffle_epi32::<0b01_00_11_10>(s4));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<0b10_11_00_01>(s2)));
        // i32 -> i16 -> i8 (values within −128..=127); packs work per 128-bit half.
        let w = _mm256_packs_epi32(q[0], q[1]);
        let b = _mm256_packs_epi16(w, w);
        let b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 0, 4, 1, 5));
        // SAFETY: bytes 4 + 16g .. +16 are inside the 292.
        unsafe {
            _mm_storeu_si128(
                out.as_mut_ptr().add(4 + 16 * g) as *mut __m128i,
                _mm256_castsi256_si128(b),
            );
        }
        out[260 + 2 * g..][..2].copy_from_slice(&(sum as i16).to_le_bytes());
    }
    out[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq")]
unsafe fn q8_k_block_avx512(x: &[f32], out: &mut [u8]) {
    let sign = _mm512_set1_ps(-0.0);
    // SAFETY: 16 loads of 16 values within x's 256 (caller).
    let v: [__m512; 16] =
        std::array::from_fn(|i| unsafe { _mm512_loadu_ps(x.as_ptr().add(16 * i)) });
    let mut m = _mm512_setzero_ps();
    for vi in &v {
        m = _mm512_max_ps(m, _mm512_andnot_ps(sign, *vi));
    }
    let amax = _mm512_reduce_max_ps(m);
    if amax == 0.0 {
        out.fill(0);
        return;
    }
    // The first value of that magnitude, with its sign (as the reference's strict `>` scan).
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
    let iscale = -127.0 / max;
    let sv = _mm512_set1_ps(iscale);
    let cap = _mm512_set1_epi32(127);
    const R: i32 = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    for (i, vi) in v.iter().enumerate() {
        let q = _mm512_min_epi32(
            _mm512_cvtps_epi32(_mm512_roundscale_ps::<R>(_mm512_mul_ps(*vi, sv))),
            cap,
        );
        let sum = _mm512_reduce_add_epi32(q) as i16;
        // SAFETY: bytes 4 + 16i .. +16 and the sum's two bytes are inside the 292.
        unsafe {
            _mm_storeu_si128(
                out.as_mut_ptr().add(4 + 16 * i) as *mut __m128i,
                _mm512_cvtepi32_epi8(q),
            );
        }
        out[260 + 2 * i..][..2].copy_from_slice(&sum.to_le_bytes());
    }
    out[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Values across f16's range and beyond: ties, subnormals, overflow, infinities, NaN.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..20_000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
            .collect();
        v.extend([
            0.0,
            -0.0,
            1.0 + 1.0 / 2048.0,
            65504.0,
            65520.0,
            1e-8,
            6e-5,
            -7e-6,
        ]);
        v.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 1e30, -1e30]);
        v
    }

    #[test]
    fn f16_rows_round_as_the_reference_on_every_level() {
        let x = inputs();
        let n = x.len() / 8 * 8;
        let want: Vec<u16> = x.iter().map(|&v| half::f32_to_f16(v)).collect();
        let same = |a: u16, b: u16| {
            a == b
                || (a & 0x7c00 == 0x7c00
                    && a & 0x3ff != 0
                    && b & 0x7c00 == 0x7c00
                    && b & 0x3ff != 0)
        };
        type Convert = fn(*const f32, *mut u8, usize) -> usize;
        let mut runs: Vec<(&str, Convert)> = Vec::new();
        if super::super::Isa::available().contains(&super::super::Isa::Avx2) {
            // SAFETY: F16C present (the AVX2 level checks it).
            runs.push(("f16c", |s, d, n| unsafe { f32_to_f16_f16c(s, d, n) }));
        }
        if super::super::vexp::available() {
            // SAFETY: AVX-512F present.
            runs.push(("avx512", |s, d, n| unsafe { f32_to_f16_avx512(s, d, n) }));
        }
        assert!(!runs.is_empty() || super::super::required_by_test("F16C", false));
        for (name, f) in runs {
            let mut out = vec![0u8; 2 * n];
            let done = f(x.as_ptr(), out.as_mut_ptr(), n);
            assert_eq!(
                done,
                n / if name == "f16c" { 8 } else { 16 } * if name == "f16c" { 8 } else { 16 }
            );
            for i in 0..done {
                let got = u16::from_le_bytes([out[2 * i], out[2 * i + 1]]);
                assert!(
                    same(got, want[i]),
                    "{name}: {} -> {got:#06x}, want {:#06x}",
                    x[i],
                    want[i]
                );
            }
            let mut r = vec![0u8; 4 * n];
            let rounded = if name == "f16c" {
                // SAFETY: as above.
                unsafe { round_f16_f16c(&x[..n], &mut r) }
            } else {
                // SAFETY: as above.
                unsafe { round_f16_avx512(&x[..n], &mut r) }
            };
            for i in 0..rounded {
                let got = f32::from_le_bytes(r[4 * i..4 * i + 4].try_into().unwrap());
                let w = half::f16_to_f32(want[i]);
                assert!(
                    got.to_bits() == w.to_bits() || (got.is_nan() && w.is_nan()),
                    "{name}: round {}",
                    x[i]
                );
            }
        }
    }
}
