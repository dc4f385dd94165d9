//! The gradient tiles compiled for AVX2 against the same tiles compiled for AVX-512: dq, dk,
//! dv and the per-row statistics bit for bit, with no mask, a causal mask and an irregular one,
//! grouped query heads and partial tiles.

use tinynn_core::tensor::Layout;
use tinynn_format::GgmlType;

use super::*;
use crate::simd::{required_by_test, Isa};

fn values(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .flat_map(|i| {
            let x = i
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed.wrapping_mul(40_503));
            (((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 2.0).to_le_bytes()
        })
        .collect()
}

fn raw(buf: &mut [u8], ne: [usize; 4]) -> RawTensor {
    RawTensor {
        ptr: buf.as_mut_ptr(),
        layout: Layout::contiguous(GgmlType::F32, ne),
    }
}

/// Both phases over every tile; returns the flat output (dq, dk, dv) and the statistics.
fn gradient(mask: u8, wide: bool, d: usize) -> (Vec<u32>, Vec<u64>) {
    let (n_q, n_head, n_head_kv) = (19, 4, 2);
    let n_kv = n_q;
    let group = n_head / n_head_kv;
    let (mut q, mut k, mut v) = (
        values(d * n_q * n_head, 1),
        values(d * n_kv * n_head_kv, 2),
        values(d * n_kv * n_head_kv, 3),
    );
    let mut d_out = values(d * n_head * n_q, 4);
    let mut m: Vec<u8> = (0..n_kv * n_q)
        .flat_map(|e| {
            let (j, i) = (e % n_kv, e / n_kv);
            let x = match mask {
                1 if j > i => f32::NEG_INFINITY,
                2 if (j * 7 + i * 3) % 5 == 0 => f32::NEG_INFINITY,
                2 => ((j + i) % 3) as f32 * 0.25,
                _ => 0.0,
            };
            x.to_le_bytes()
        })
        .collect();
    let (nq, nk) = (d * n_q * n_head, d * n_kv * n_head_kv);
    let mut out = vec![0f32; nq + 2 * nk];
    let mut stats = vec![0f64; 2 * n_q * n_head];
    let io = BackIo {
        q: raw(&mut q, [d, n_q, n_head, 1]),
        k: raw(&mut k, [d, n_kv, n_head_kv, 1]),
        v: raw(&mut v, [d, n_kv, n_head_kv, 1]),
        mask: (mask > 0).then(|| raw(&mut m, [n_kv, n_q, 1, 1])),
        d_out: raw(&mut d_out, [d, n_head, n_q, 1]),
        scale: 0.17,
        out: out.as_mut_ptr(),
        dk_at: nq,
        dv_at: nq + nk,
        stats: stats.as_mut_ptr(),
    };
    let mut s = BackScratch::new();
    let per_kv_head = (n_q * group).div_ceil(LANES);
    // SAFETY (both loops): the caller checked the instruction sets; every tensor holds the
    // elements the tiles read; one thread writes everything; the query tiles run first.
    for hk in 0..n_head_kv {
        for t in 0..per_kv_head {
            let lanes: Vec<(usize, usize)> = (t * LANES..((t + 1) * LANES).min(n_q * group))
                .map(|p| (p / group, hk * group + p % group))
                .collect();
            unsafe {
                if wide {
                    query_tile_avx512(&io, hk, &lanes, &mut s)
                } else {
                    query_tile_avx2(&io, hk, &lanes, &mut s)
                }
            }
        }
    }
    for hk in 0..n_head_kv {
        for j0 in (0..n_kv).step_by(LANES) {
            let n = LANES.min(n_kv - j0);
            unsafe {
                if wide {
                    kv_tile_avx512(&io, hk, j0, n, group, &mut s)
                } else {
                    kv_tile_avx2(&io, hk, j0, n, group, &mut s)
                }
            }
        }
    }
    (
        out.iter().map(|x| x.to_bits()).collect(),
        stats.iter().map(|x| x.to_bits()).collect(),
    )
}

#[test]
fn avx2_gradient_tiles_give_the_avx512_bits() {
    if !required_by_test(
        "AVX2 attention gradient tiles",
        Isa::detected() >= Isa::Avx2,
    ) {
        return;
    }
    let both = required_by_test("AVX-512 attention gradient tiles", wide());
    // Head sizes with and without a remainder past the columns kept in registers (8 at a
    // time on AVX-512, 4 on AVX2) and the dot products' pairs.
    for d in [32, 21] {
        for mask in 0..3 {
            let (out, stats) = gradient(mask, false, d);
            assert!(
                out.iter().all(|&b| f32::from_bits(b).is_finite()),
                "d {d} mask {mask}: a non-finite gradient"
            );
            assert!(
                out.iter().any(|&b| f32::from_bits(b) != 0.0),
                "d {d} mask {mask}: all zero"
            );
            if both {
                let (want_out, want_stats) = gradient(mask, true, d);
                assert!(out == want_out, "d {d} mask {mask}: dq/dk/dv differ");
                assert!(stats == want_stats, "d {d} mask {mask}: statistics differ");
            }
        }
    }
}
