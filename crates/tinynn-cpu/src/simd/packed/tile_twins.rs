//! The AVX2 tiles against the AVX-512 tiles of the same kind: the same bits for every token
//! count, with and without a min, full and partial groups, one and many blocks.

use tinynn_core::quant;
use tinynn_format::GgmlType;

use super::{nibbles, pack_always, q4_kx16, q6_kx16, q8_0x16, wide, GroupIn, TileFn, GROUP_ROWS};
use crate::simd::{required_by_test, Isa};

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Runs `tile` for `t` tokens over group 0 of a `[k, 16]` weight of type `ty` (`None`: Q8_0
/// blocks of 7-bit quants, as `Q7_0x16` holds).
fn run(
    tile: TileFn,
    ty: Option<GgmlType>,
    k: usize,
    t: usize,
    valid: usize,
    seed: u64,
) -> Vec<f32> {
    let w = noise(k * GROUP_ROWS, seed);
    let q7 = ty.is_none();
    let ty = ty.unwrap_or(GgmlType::Q8_0);
    let rb = quant::row_bytes(ty, k).unwrap();
    let mut bytes = vec![0u8; rb * GROUP_ROWS];
    for (src, dst) in w.chunks_exact(k).zip(bytes.chunks_exact_mut(rb)) {
        if q7 {
            super::transposed::quantize_row_q7(src, dst);
        } else {
            quant::quantize_row(ty, src, dst).unwrap();
        }
    }
    let p = pack_always(ty, [k, GROUP_ROWS, 1, 1], &bytes).unwrap();
    let x: Vec<f32> = noise(k * t, seed + 7).iter().map(|v| v * 3.0).collect();
    let row = p.activation_row_bytes();
    let mut acts = vec![0u8; row * t];
    for (xr, ar) in x.chunks_exact(k).zip(acts.chunks_exact_mut(row)) {
        p.prepare_activations(xr, ar);
    }
    let mut out = vec![f32::NAN; t * GROUP_ROWS];
    let group = GroupIn {
        w: p.data.as_bytes().as_ptr(),
        nb: k / if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
            256
        } else {
            32
        },
        pf: 0,
    };
    // SAFETY: the test checked the instruction sets; one group of k/32 blocks (k/256 for the
    // K kind), t activation rows of `row` bytes, t output rows of 16.
    unsafe {
        tile(
            group,
            acts.as_ptr(),
            row,
            out.as_mut_ptr(),
            GROUP_ROWS,
            valid,
        )
    };
    out
}

#[test]
fn avx2_tiles_give_the_avx512_bits() {
    if !required_by_test("AVX2 packed tiles", Isa::detected() >= Isa::Avx2) {
        return;
    }
    let both = required_by_test("AVX-512 VNNI packed tiles", super::wide());
    macro_rules! tiles {
        ($t:literal) => {
            [
                (
                    Some(GgmlType::Q4_0),
                    nibbles::tile_avx2::<$t, false, false, 8> as TileFn,
                    nibbles::tile::<$t, false, false, 8> as TileFn,
                ),
                (
                    Some(GgmlType::Q4_1),
                    nibbles::tile_avx2::<$t, true, false, 0>,
                    nibbles::tile::<$t, true, false, 0>,
                ),
                (
                    Some(GgmlType::Q5_0),
                    nibbles::tile_avx2::<$t, false, true, 16>,
                    nibbles::tile::<$t, false, true, 16>,
                ),
                (
                    Some(GgmlType::Q5_1),
                    nibbles::tile_avx2::<$t, true, true, 0>,
                    nibbles::tile::<$t, true, true, 0>,
                ),
                (
                    Some(GgmlType::Q8_0),
                    q8_0x16::tile_avx2::<$t, false>,
                    q8_0x16::tile::<$t>,
                ),
                (None, q8_0x16::tile_avx2::<$t, true>, q8_0x16::tile::<$t>),
                (
                    Some(GgmlType::F16),
                    wide::tile_avx2::<$t, false>,
                    wide::tile::<$t, false>,
                ),
                (
                    Some(GgmlType::F32),
                    wide::tile_avx2::<$t, true>,
                    wide::tile::<$t, true>,
                ),
            ]
        };
    }
    // The K kinds: one super-block per 256 elements, tiles of up to 4 tokens.
    for (ty, t) in [GgmlType::Q4K, GgmlType::Q6K]
        .into_iter()
        .flat_map(|ty| (1..=4).map(move |t| (ty, t)))
    {
        let (narrow, wide): (TileFn, TileFn) = match (ty, t) {
            (GgmlType::Q4K, 1) => (q4_kx16::tile_avx2::<1>, q4_kx16::tile::<1>),
            (GgmlType::Q4K, 2) => (q4_kx16::tile_avx2::<2>, q4_kx16::tile::<2>),
            (GgmlType::Q4K, 3) => (q4_kx16::tile_avx2::<3>, q4_kx16::tile::<3>),
            (GgmlType::Q4K, _) => (q4_kx16::tile_avx2::<4>, q4_kx16::tile::<4>),
            (_, 1) => (q6_kx16::tile_avx2::<1>, q6_kx16::tile::<1>),
            (_, 2) => (q6_kx16::tile_avx2::<2>, q6_kx16::tile::<2>),
            (_, 3) => (q6_kx16::tile_avx2::<3>, q6_kx16::tile::<3>),
            _ => (q6_kx16::tile_avx2::<4>, q6_kx16::tile::<4>),
        };
        for (k, valid) in [(256, 16), (512, 11), (1536, 16), (768, 3)] {
            let got = run(narrow, Some(ty), k, t, valid, 5 + k as u64);
            assert!(
                (0..t).all(|i| got[i * GROUP_ROWS..][..valid].iter().all(|v| v.is_finite())),
                "{ty} t {t} k {k}: {got:?}"
            );
            if both {
                let want = run(wide, Some(ty), k, t, valid, 5 + k as u64);
                let same = got
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(
                    same,
                    "{ty} t {t} k {k} valid {valid}: AVX2 and AVX-512 tiles differ"
                );
            }
        }
    }
    let sets = [
        (1, tiles!(1)),
        (2, tiles!(2)),
        (3, tiles!(3)),
        (4, tiles!(4)),
        (5, tiles!(5)),
        (6, tiles!(6)),
    ];
    for (t, kinds) in sets {
        for (ty, narrow, wide) in kinds {
            for (k, valid) in [(32, 16), (576, 16), (96, 5), (1536, 9), (64, 1)] {
                let got = run(narrow, ty, k, t, valid, k as u64 + t as u64);
                let f = |v: &f32| v.is_finite();
                let written: Vec<f32> = (0..t)
                    .flat_map(|i| got[i * GROUP_ROWS..][..valid].to_vec())
                    .collect();
                assert!(written.iter().all(f), "{ty:?} t {t} k {k}: {written:?}");
                let untouched = (0..t).all(|i| {
                    got[i * GROUP_ROWS + valid..][..GROUP_ROWS - valid]
                        .iter()
                        .all(|v| v.is_nan())
                });
                assert!(untouched, "{ty:?} t {t} k {k}: wrote past {valid} columns");
                if both {
                    let want = run(wide, ty, k, t, valid, k as u64 + t as u64);
                    let same = got
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{ty:?} t {t} k {k} valid {valid}: AVX2 {got:?}\nAVX-512 {want:?}"
                    );
                }
            }
        }
    }
}
