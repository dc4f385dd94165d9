//! The attention tiles compiled for AVX2 against the same tiles compiled for AVX-512: the same
//! bits for F16 and F32 K/V, no mask, a causal mask (rebuilt from its runs) and an irregular
//! one (gathered), full and partial tiles, grouped query heads.

use tinynn_core::tensor::Layout;
use tinynn_format::GgmlType;

use super::*;
use crate::simd::{required_by_test, Isa};

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n as u32)
        .map(|i| {
            let x = i
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503));
            ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn raw(buf: &mut [u8], dtype: GgmlType, ne: [usize; 4]) -> RawTensor {
    RawTensor {
        ptr: buf.as_mut_ptr(),
        layout: Layout::contiguous(dtype, ne),
    }
}

/// Every tile of a `[d, n_q, n_head]` attention over `n_kv` rows, with the AVX-512 entry
/// (`wide`) or the AVX2 one; returns the output `[dv, n_head, n_q]`.
fn attend_all(kv16: bool, mask: u8, wide: bool, d: usize) -> Vec<f32> {
    let (n_q, n_head, n_head_kv, n_kv) = (21, 4, 2, 97);
    let group = n_head / n_head_kv;
    let to_bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut q = to_bytes(&values(d * n_q * n_head, 1));
    let kv = |seed| {
        let v = values(d * n_kv * n_head_kv, seed);
        if kv16 {
            v.iter()
                .flat_map(|&x| tinynn_core::quant::half::f32_to_f16(x).to_le_bytes())
                .collect()
        } else {
            to_bytes(&v)
        }
    };
    let (mut k, mut v) = (kv(2), kv(3));
    let kv_ty = if kv16 { GgmlType::F16 } else { GgmlType::F32 };
    let mut m: Vec<u8> = to_bytes(
        &(0..n_kv * n_q)
            .map(|e| {
                let (j, i) = (e % n_kv, e / n_kv);
                match mask {
                    // Causal over the last n_q rows.
                    1 if j > n_kv - n_q + i => f32::NEG_INFINITY,
                    // Irregular: holes and small biases.
                    2 if (j * 7 + i * 3) % 5 == 0 => f32::NEG_INFINITY,
                    2 => ((j + i) % 3) as f32 * 0.25,
                    _ => 0.0,
                }
            })
            .collect::<Vec<f32>>(),
    );
    let mut out = vec![0u8; 4 * d * n_head * n_q];
    let io = TileIo {
        q: raw(&mut q, GgmlType::F32, [d, n_q, n_head, 1]),
        k: raw(&mut k, kv_ty, [d, n_kv, n_head_kv, 1]),
        v: raw(&mut v, kv_ty, [d, n_kv, n_head_kv, 1]),
        mask: (mask > 0).then(|| raw(&mut m, GgmlType::F32, [n_kv, n_q, 1, 1])),
        dst: raw(&mut out, GgmlType::F32, [d, n_head, n_q, 1]),
        n_kv,
        scale: 0.125,
    };
    let mut scratch = TileScratch::new();
    let per_kv_head = (n_q * group).div_ceil(LANES);
    for hk in 0..n_head_kv {
        for t in 0..per_kv_head {
            let pairs = t * LANES..((t + 1) * LANES).min(n_q * group);
            let lanes: Vec<(usize, usize)> =
                pairs.map(|p| (p / group, hk * group + p % group)).collect();
            // SAFETY: the caller checked the instruction sets; the tensors above hold every
            // element the tiles read; one thread writes the output.
            unsafe {
                if wide {
                    attend_avx512(&io, hk, &lanes, &mut scratch)
                } else {
                    attend_avx2(&io, hk, &lanes, &mut scratch)
                }
            }
        }
    }
    out.chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn avx2_attention_tiles_give_the_avx512_bits() {
    if !required_by_test("AVX2 attention tiles", Isa::detected() >= Isa::Avx2) {
        return;
    }
    let both = required_by_test("AVX-512 attention tiles", wide());
    // Head sizes with and without a remainder past the value columns kept in registers
    // (8 at a time on AVX-512, 4 on AVX2) and the dot products' pairs.
    for d in [64, 21] {
        for kv16 in [false, true] {
            for mask in 0..3 {
                let got = attend_all(kv16, mask, false, d);
                assert!(
                    got.iter().all(|x| x.is_finite()),
                    "d {d} kv16 {kv16} mask {mask}"
                );
                assert!(
                    got.iter().any(|&x| x != 0.0),
                    "d {d} kv16 {kv16} mask {mask}: all zero"
                );
                if both {
                    let want = attend_all(kv16, mask, true, d);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "d {d} kv16 {kv16} mask {mask}: AVX2 and AVX-512 tiles differ"
                    );
                }
            }
        }
    }
}
