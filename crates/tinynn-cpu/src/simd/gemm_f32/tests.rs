//! The AVX2 and AVX-512 tiles against each other (same bits) and against an f64 product, over
//! ragged shapes: partial tiles of `i` and `m`, several reduction blocks, both packings of A
//! (rows contiguous in `i`, or transposed) and the copied block of B.

use super::*;
use crate::simd::{required_by_test, Isa};

/// A deterministic value in [-1, 1) for element `k` of operand `salt`.
fn value(k: usize, salt: usize) -> f32 {
    // splitmix64 of (salt, k).
    let mut h = (salt as u64) << 40 ^ k as u64;
    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// `C` from the tiles (`wide`: AVX-512) for one shape and layout, in jobs of `ig` tiles.
fn product(
    (ni, nm, nr): (usize, usize, usize),
    a_transposed: bool,
    b_far_rows: bool,
    wide: bool,
    ig: usize,
) -> (Vec<f32>, Vec<(f64, f64)>) {
    // A(r, i): rows contiguous in i, or (transposed) columns contiguous in r.
    let a: Vec<f32> = (0..ni * nr).map(|k| value(k, 1)).collect();
    let (a_rs, a_xs) = if a_transposed { (1, nr) } else { (ni, 1) };
    // B(m, r): contiguous in r, or contiguous in m with rows COPY_B_MIN_STRIDE apart.
    let (b_rs, b_xs) = if b_far_rows {
        (COPY_B_MIN_STRIDE.max(nm), 1)
    } else {
        (1, nr)
    };
    let b: Vec<f32> = (0..nm * nr).map(|k| value(k, 2)).collect::<Vec<_>>();
    let mut b_laid = vec![0f32; if b_far_rows { b_rs * nr } else { nm * nr }];
    for m in 0..nm {
        for r in 0..nr {
            b_laid[m * b_xs + r * b_rs] = b[m * nr + r];
        }
    }
    let cm = ni + 3;
    let mut c = vec![f32::NAN; cm * nm];
    let g = Gemm {
        a: Strided {
            ptr: a.as_ptr(),
            rs: a_rs,
            xs: a_xs,
        },
        b: Strided {
            ptr: b_laid.as_ptr(),
            rs: b_rs,
            xs: b_xs,
        },
        c: c.as_mut_ptr(),
        cm,
        ni,
        nm,
        nr,
        bf16: false,
    };
    let mut copy = vec![0f32; B_COPY_LEN];
    for job in 0..g.jobs(ig) {
        let b_copy = b_far_rows.then_some(&mut copy);
        // SAFETY: every operand is a live Vec of the sizes laid out above; the ISA was checked
        // by the caller.
        unsafe { g.run_job_f32(job, ig, b_copy, wide) };
    }
    // (Σ A·B, Σ |A·B|) in f64.
    let mut want = vec![(0f64, 0f64); ni * nm];
    for m in 0..nm {
        for i in 0..ni {
            for r in 0..nr {
                let p = f64::from(a[r * a_rs + i * a_xs]) * f64::from(b[m * nr + r]);
                want[m * ni + i].0 += p;
                want[m * ni + i].1 += p.abs();
            }
        }
    }
    let got = (0..nm)
        .flat_map(|m| c[m * cm..m * cm + ni].to_vec())
        .collect();
    (got, want)
}

#[test]
fn avx2_tiles_match_avx512_bits_and_the_f64_product() {
    if !required_by_test("AVX2 + FMA f32 GEMM", available()) {
        return;
    }
    let both = required_by_test("AVX-512 f32 GEMM", wide());
    let shapes = [
        (1, 1, 1),
        (5, 3, 7),
        (16, 8, 256),
        (17, 9, 257),
        (31, 5, 100),
        (32, 8, 513),
        (33, 13, 64),
        (47, 7, 300),
        (130, 260, 40),
        (64, 300, 9),
        // Whole reduction blocks over a whole block of m, and a partial one after it.
        (40, 300, 513),
    ];
    let mut checked = 0;
    for &shape in &shapes {
        for a_transposed in [false, true] {
            for b_far_rows in [false, true] {
                let (got, want) = product(shape, a_transposed, b_far_rows, false, IG);
                let nr = shape.2 as f64;
                for (k, (&g, &(w, w_abs))) in got.iter().zip(&want).enumerate() {
                    // f32 summation of nr products: a few ulps per √nr of Σ|A·B|.
                    let tol = 4.0 * f64::from(f32::EPSILON) * nr.sqrt() * w_abs + 1e-30;
                    assert!(
                        (f64::from(g) - w).abs() <= tol,
                        "{shape:?} transposed {a_transposed} far {b_far_rows}: C[{k}] = {g}, \
                         f64 {w}"
                    );
                }
                // However the work is cut into jobs, the same bits.
                for ig in 1..IG {
                    let (cut, _) = product(shape, a_transposed, b_far_rows, false, ig);
                    let same = got
                        .iter()
                        .zip(&cut)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{shape:?}: jobs of {ig} tiles change the result");
                }
                if both {
                    let (wide_c, _) = product(shape, a_transposed, b_far_rows, true, IG);
                    let same = got
                        .iter()
                        .zip(&wide_c)
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{shape:?}: AVX2 and AVX-512 tiles differ");
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, shapes.len() * 4);
    eprintln!("checked at {:?}", Isa::detected());
}

/// A product of `ni` × `nm` outputs with no operands: for how its work is cut, never run.
fn shape_only(ni: usize, nm: usize) -> Gemm {
    Gemm {
        a: Strided {
            ptr: std::ptr::null(),
            rs: 0,
            xs: 1,
        },
        b: Strided {
            ptr: std::ptr::null(),
            rs: 1,
            xs: 0,
        },
        c: std::ptr::null_mut(),
        cm: ni,
        ni,
        nm,
        nr: 1,
        bf16: false,
    }
}

#[test]
fn few_jobs_are_cut_so_the_threads_share_the_tiles_evenly() {
    // SmolLM2's head gradient per 128-token chunk: 18 tiles, 4 a job load 8 : 10 at best.
    assert_eq!(shape_only(576, 128).tiles_per_job(1, 2), 3);
    // Many jobs: the default, which reuses B most.
    assert_eq!(shape_only(576, 1024).tiles_per_job(1, 2), IG);
    assert_eq!(shape_only(1536, 1024).tiles_per_job(1, 2), IG);
    assert_eq!(shape_only(576, 128).tiles_per_job(1, 1), IG);
    // Every choice cuts into at least as many jobs as the default.
    for ni in [1, 31, 32, 100, 576, 1536, 2048] {
        for nm in [1, 7, 128, 300, 1024] {
            for nth in 1..=4 {
                let g = shape_only(ni, nm);
                let ig = g.tiles_per_job(2, nth);
                assert!(
                    (1..=IG).contains(&ig) && g.jobs(ig) >= g.jobs(IG),
                    "{ni} {nm} {nth}"
                );
            }
        }
    }
}

#[test]
fn threads_get_every_job_once_in_runs_of_about_equal_work() {
    for ni in [1, 31, 32, 100, 576, 1536] {
        for nm in [1, 7, 128, 300, 576, 1024] {
            for batches in [1, 3] {
                for nth in 1..=5 {
                    let g = shape_only(ni, nm);
                    for ig in 1..=IG {
                        let n = g.jobs(ig) * batches;
                        let mut next = 0;
                        let mut loads = Vec::new();
                        for t in 0..nth {
                            let r = g.thread_jobs(ig, batches, t, nth);
                            assert!(r.start == next || r.is_empty(), "{ni} {nm} {nth} {t}");
                            if !r.is_empty() {
                                next = r.end;
                            }
                            loads.push(r.map(|j| g.job_load(ig, j % g.jobs(ig))).sum::<usize>());
                        }
                        assert_eq!(next, n, "{ni} {nm} {batches} {nth} {ig}: jobs left over");
                        // No thread carries more than its share and one job.
                        let total: usize = loads.iter().sum();
                        let biggest = (0..g.jobs(ig)).map(|j| g.job_load(ig, j)).max();
                        let most = loads.iter().copied().max().unwrap_or(0);
                        assert!(most <= total.div_ceil(nth) + biggest.unwrap_or(0));
                    }
                }
            }
        }
    }
    // SmolLM2's [576, 576] weight gradient (m chunks of 256, 256 and 64): by job counts
    // the two threads' work was 3 : 1; now within 10%.
    let g = shape_only(576, 576);
    let ig = g.tiles_per_job(1, 2);
    let [a, b] = [0, 1].map(|t| {
        g.thread_jobs(ig, 1, t, 2)
            .map(|j| g.job_load(ig, j))
            .sum::<usize>()
    });
    assert!(a.max(b) * 10 <= (a + b) * 11 / 2, "{a} : {b}");
}
