//! Every SIMD dot-product kernel against the scalar reference, for every instruction set this
//! CPU has, on rows of 1 to 33 blocks.

mod common;

use common::{weight_bytes, Rng};
use tinynn_core::quant::{self, SUPPORTED};
use tinynn_cpu::simd::{dot_fn_for, required_by_test, Isa};

#[test]
fn simd_kernels_match_the_reference() {
    let mut rng = Rng::new(12);
    let mut tested = Vec::new();
    for isa in Isa::available()
        .iter()
        .copied()
        .filter(|&i| i != Isa::Scalar)
    {
        for ty in SUPPORTED {
            let Some(f) = dot_fn_for(ty, isa) else {
                continue;
            };
            let dot_ty = quant::vec_dot_type(ty).unwrap();
            let qk = ty.layout().block_elems as usize;
            let qk = qk.max(dot_ty.layout().block_elems as usize);
            for blocks in [1, 2, 3, 7, 16, 33] {
                let n = blocks * qk;
                let x = weight_bytes(ty, n, 1, &mut rng);
                let yf: Vec<f32> = rng.vec(n).iter().map(|v| v * 3.0).collect();
                let mut y = vec![0u8; quant::row_bytes(dot_ty, n).unwrap()];
                quant::quantize_row(dot_ty, &yf, &mut y).unwrap();
                let want = quant::vec_dot(ty, n, &x, &y).unwrap();
                let got = f(&x, &y);
                let (mut xd, mut yd) = (vec![0f32; n], vec![0f32; n]);
                quant::dequantize_row(ty, &x, &mut xd).unwrap();
                quant::dequantize_row(dot_ty, &y, &mut yd).unwrap();
                let scale: f32 = xd.iter().zip(&yd).map(|(a, b)| (a * b).abs()).sum();
                assert!(
                    (got - want).abs() <= 1e-5 * scale + 1e-6,
                    "{ty} on {}: {blocks} blocks: simd {got}, reference {want}",
                    isa.name()
                );
            }
            tested.push(format!("{ty}/{}", isa.name()));
        }
    }
    eprintln!("SIMD kernels checked: {}", tested.join(", "));
    if required_by_test("AVX2 + FMA + F16C", Isa::available().contains(&Isa::Avx2)) {
        for must in [
            "Q4_0/avx2",
            "Q4_1/avx2",
            "Q8_0/avx2",
            "F32/avx2",
            "F16/avx2",
            "Q5_0/avx2",
            "Q5_1/avx2",
            "Q2_K/avx2",
            "Q3_K/avx2",
            "Q4_K/avx2",
            "Q5_K/avx2",
            "Q6_K/avx2",
            "BF16/avx2",
            "Q8_1/avx2",
            "Q8_K/avx2",
        ] {
            assert!(tested.iter().any(|t| t == must), "{must} missing");
        }
    }
    if required_by_test("AVX-512 VNNI", Isa::available().contains(&Isa::Avx512Vnni)) {
        for must in [
            "Q4_0/avx512vnni",
            "Q4_1/avx512vnni",
            "Q8_0/avx512vnni",
            "Q5_0/avx512vnni",
            "Q5_1/avx512vnni",
            "F32/avx512vnni",
            "F16/avx512vnni",
            "Q4_K/avx512vnni",
            "Q6_K/avx512vnni",
            "Q5_K/avx512vnni",
            "Q3_K/avx512vnni",
            "Q2_K/avx512vnni",
        ] {
            assert!(tested.iter().any(|t| t == must), "{must} missing");
        }
    }
    if required_by_test("AVX-512 BF16", Isa::available().contains(&Isa::Avx512Bf16)) {
        assert!(
            tested.iter().any(|t| t == "BF16/avx512bf16"),
            "BF16/avx512bf16 missing"
        );
    }
}

#[test]
fn vector_exp_is_correctly_rounded() {
    // A dense sweep of the range where exp(x) is a finite non-zero f32, plus specials.
    let mut xs: Vec<f32> = (0..2_000_000)
        .map(|i| -110.0 + 200.0 * i as f32 / 2_000_000.0)
        .collect();
    xs.extend([
        0.0, -0.0, 1e-30, -1e-30, 88.7, 88.8, -103.9, -104.0, -87.3, 0.5, -0.5,
    ]);
    xs.extend([
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ]);
    let mut got = xs.clone();
    tinynn_cpu::simd::vexp::exp_slice(&mut got);
    let mut off = 0;
    for (&x, &g) in xs.iter().zip(&got) {
        // f64 exp rounded once to f32: the correctly rounded result but for ties within
        // f64's error, which this sweep does not meet.
        let want = (x as f64).exp() as f32;
        if want.is_nan() {
            assert!(g.is_nan(), "exp({x}) = {g}, want NaN");
            continue;
        }
        if g.to_bits() != want.to_bits() {
            off += 1;
        }
        // libm's expf is within one unit in the last place of it.
        let ulps = (g.to_bits() as i64 - x.exp().to_bits() as i64).abs();
        assert!(ulps <= 1, "exp({x}) = {g}, libm {}", x.exp());
    }
    assert_eq!(off, 0, "{off} of {} not correctly rounded", xs.len());
}

#[test]
fn simd_activation_quantizer_is_bit_identical() {
    let mut x: Vec<f32> = (0..32 * 40)
        .map(|i| ((i * 7919) % 1000) as f32 / 37.0 - 13.0)
        .collect();
    x[..32].fill(0.0); // an all-zero block
    x[32..64]
        .iter_mut()
        .enumerate()
        .for_each(|(i, v)| *v = 0.5 * i as f32 - 8.0); // ties
    x[70] = 1e-30;
    let mut want = vec![0u8; 40 * 36];
    tinynn_core::quant::quantize_activations(tinynn_format::GgmlType::Q8_1, &x, &mut want).unwrap();
    let mut got = vec![0u8; 40 * 36];
    tinynn_cpu::simd::quantize_q8::q8_1_row(&x, &mut got, false);
    assert_eq!(got, want);
    tinynn_cpu::simd::quantize_q8::q8_1_row(&x, &mut got, true);
    for (b, (g, w)) in got.chunks_exact(36).zip(want.chunks_exact(36)).enumerate() {
        assert_eq!(g[..2], w[..2], "block {b} scale");
        assert_eq!(g[4..], w[4..], "block {b} quants");
        let sum: i32 = w[4..].iter().map(|&q| i32::from(q as i8)).sum();
        assert_eq!(
            i16::from_le_bytes([g[2], g[3]]),
            sum as i16,
            "block {b} sum"
        );
    }
}

/// The four-row kernels give, row by row, the one-row kernel's bits (so a prompt's product
/// equals decode's), over rows of 1 to 33 blocks with varied scales.
#[test]
fn four_row_dots_equal_one_row_dots() {
    use tinynn_cpu::simd::dot4_fn_for;
    if !required_by_test("AVX2 four-row dots", Isa::available().contains(&Isa::Avx2)) {
        return;
    }
    let mut rng = Rng::new(31);
    let mut tested = 0;
    for ty in SUPPORTED {
        let Some(f4) = dot4_fn_for(ty, Isa::Avx2) else {
            continue;
        };
        let f1 = dot_fn_for(ty, Isa::Avx2).unwrap();
        let dot_ty = quant::vec_dot_type(ty).unwrap();
        for blocks in [1, 2, 7, 18, 33] {
            let n = blocks * 32;
            let x = weight_bytes(ty, n, 1, &mut rng);
            let ys: Vec<Vec<u8>> = (0..4)
                .map(|r| {
                    let yf: Vec<f32> = rng.vec(n).iter().map(|v| v * (1 + 10 * r) as f32).collect();
                    let mut y = vec![0u8; quant::row_bytes(dot_ty, n).unwrap()];
                    quant::quantize_activations(dot_ty, &yf, &mut y).unwrap();
                    y
                })
                .collect();
            let got = f4(&x, std::array::from_fn(|r| ys[r].as_slice()));
            for (r, y) in ys.iter().enumerate() {
                let want = f1(&x, y);
                assert_eq!(
                    got[r].to_bits(),
                    want.to_bits(),
                    "{ty} {blocks} blocks row {r}"
                );
            }
        }
        tested += 1;
    }
    assert_eq!(tested, 3, "Q4_0, Q4_1 and Q8_0 have four-row kernels");
}

/// The unpacked products' activation quantizer (AVX2) against the reference, Q8_0 and Q8_1,
/// bit for bit: random rows at several scales, all-zero blocks, ties, subnormals, and NaN and
/// infinite values (the reference's `as i8` gives 0 for NaN; an infinity zeroes its block).
#[test]
fn activation_q8_rows_equal_the_reference() {
    use tinynn_format::GgmlType::{Q8_0, Q8_1};
    let avx2 = Isa::detected() >= Isa::Avx2;
    if !required_by_test("AVX2 activation quantizer", avx2) {
        return;
    }
    let mut rng = Rng::new(77);
    for case in 0..60 {
        let blocks = 1 + case % 9;
        let scale = [1e-3f32, 1.0, 37.0, 3e4][case % 4];
        let mut x: Vec<f32> = rng.vec(32 * blocks).iter().map(|v| v * scale).collect();
        match case % 6 {
            1 => x[..32].fill(0.0),
            2 => x[..32]
                .iter_mut()
                .enumerate()
                .for_each(|(i, v)| *v = 0.5 * i as f32 - 8.0),
            3 => x[5] = f32::NAN,
            4 => {
                x[9] = if case % 2 == 0 {
                    f32::INFINITY
                } else {
                    f32::NEG_INFINITY
                }
            }
            5 => x[3] = 1e-40,
            _ => {}
        }
        for ty in [Q8_0, Q8_1] {
            let bytes = quant::row_bytes(ty, x.len()).unwrap();
            let mut want = vec![0u8; bytes];
            quant::quantize_activations(ty, &x, &mut want).unwrap();
            let mut got = vec![0xAAu8; bytes];
            tinynn_cpu::simd::quantize_q8::q8_activations(ty, &x, &mut got).unwrap();
            assert_eq!(got, want, "case {case} {ty:?}");
        }
    }
}

/// The one-pass SwiGLU gradient (AVX-512 f64 lanes) against its scalar formula, over gates
/// from −110 (the clamped exp's scalar fallback) to 30, at most one f32 ulp apart.
#[test]
fn swiglu_back_matches_its_scalar_formula() {
    use tinynn_cpu::simd::vexp::{swiglu_back_one, swiglu_back_slices};
    let n = 10_007;
    let g: Vec<f32> = (0..n)
        .map(|i| -110.0 + 140.0 * i as f32 / n as f32)
        .collect();
    let u: Vec<f32> = (0..n)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
        .collect();
    let dy: Vec<f32> = (0..n)
        .map(|i| ((i * 53 % 97) as f32 - 48.0) / 11.0)
        .collect();
    let (mut dg, mut du) = (vec![0f32; n], vec![0f32; n]);
    swiglu_back_slices(&g, &u, &dy, &mut dg, &mut du);
    for i in 0..n {
        let (wg, wu) = swiglu_back_one(g[i], u[i], dy[i]);
        for (got, want) in [(dg[i], wg), (du[i], wu)] {
            let ulps = (got.to_bits() as i64 - want.to_bits() as i64).abs();
            assert!(
                ulps <= 1,
                "g {} u {} dy {}: {got} vs {want}",
                g[i],
                u[i],
                dy[i]
            );
        }
    }
}

/// The Q8_K activation quantizer equals the reference bit for bit: noise at several
/// magnitudes, an all-zero block, the largest magnitude twice with opposite signs (the first
/// one's sign wins), values that round to exact ties, and a block holding a NaN.
#[test]
fn q8_k_rows_equal_the_reference() {
    use tinynn_core::quant;
    use tinynn_cpu::simd::quantize_q8::q8_k_row;
    use tinynn_format::GgmlType;
    let mut blocks: Vec<Vec<f32>> = Vec::new();
    for (i, scale) in [1e-3f32, 0.7, 3.0, 1e4].into_iter().enumerate() {
        blocks.push(
            (0..256)
                .map(|j| (((j * 7919 + i * 31) % 1001) as f32 / 500.0 - 1.0) * scale)
                .collect(),
        );
    }
    blocks.push(vec![0.0; 256]);
    let mut twins: Vec<f32> = (0..256).map(|j| (j % 13) as f32 - 6.0).collect();
    twins[10] = -9.0;
    twins[200] = 9.0;
    blocks.push(twins.clone());
    twins[10] = 9.0;
    twins[200] = -9.0;
    blocks.push(twins);
    blocks.push((0..256).map(|j| (j as f32 - 128.0) * 0.5).collect());
    let mut nan: Vec<f32> = (0..256).map(|j| j as f32).collect();
    nan[77] = f32::NAN;
    blocks.push(nan);
    let x: Vec<f32> = blocks.concat();
    let mut got = vec![0u8; x.len() / 256 * 292];
    let mut want = got.clone();
    q8_k_row(&x, &mut got);
    quant::quantize_activations(GgmlType::Q8K, &x, &mut want).unwrap();
    for (b, (g, w)) in got.chunks(292).zip(want.chunks(292)).enumerate() {
        assert_eq!(g, w, "block {b}");
    }
}

/// GeGLU's row kernel (16 lanes with a correctly rounded exp, tail scalar) against the f64
/// value of `0.5·g·(1 + tanh(c·(g + 0.044715·g³)))·u` over gates from −60 to 60 and lengths
/// around the 16-value chunks: within `2.4e-7·(3 + |z|)` relative, `z = 2c·g·(1 + 0.044715·g²)`
/// (for negative gates the value is `g·e^{-|z|}`-like, and f32 rounding of z alone moves it by
/// a few times `|z|` ulps; plus 1e-30 absolute where it underflows).
#[test]
fn geglu_matches_gelu_tanh_in_f64() {
    use tinynn_cpu::simd::vexp::{geglu_one, geglu_slices};
    let reference = |g: f32, u: f32| {
        let x = f64::from(g);
        let c = (2.0 / std::f64::consts::PI).sqrt();
        // = 0.5·x·(1 + tanh(c·(x + 0.044715·x³))), without its cancellation for x ≪ 0.
        x / (1.0 + (-2.0 * c * (x + 0.044715 * x * x * x)).exp()) * f64::from(u)
    };
    for n in [1usize, 15, 16, 17, 31, 33, 10_007] {
        let g: Vec<f32> = (0..n)
            .map(|i| -60.0 + 120.0 * i as f32 / n as f32)
            .collect();
        let u: Vec<f32> = (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut out = vec![0f32; n];
        geglu_slices(&g, &u, &mut out);
        for i in 0..n {
            let want = reference(g[i], u[i]);
            for got in [out[i], geglu_one(g[i], u[i])] {
                let err = (f64::from(got) - want).abs();
                let x = f64::from(g[i]);
                let z = 2.0 * 0.797_884_6 * x * (1.0 + 0.044715 * x * x);
                assert!(
                    err <= 2.4e-7 * (3.0 + z.abs()) * want.abs() + 1e-30,
                    "n {n}, g {} u {}: {got} vs {want}",
                    g[i],
                    u[i]
                );
            }
        }
    }
}

/// The lane-parallel row maximum equals a plain fold, NaNs ignored, on lengths around its
/// 16-value chunks.
#[test]
fn row_max_equals_a_fold() {
    use tinynn_cpu::simd::vexp::row_max;
    let mut rng = common::Rng::new(4);
    for n in [0, 1, 15, 16, 17, 33, 49152] {
        let mut row: Vec<f32> = rng.vec(n).iter().map(|v| v * 100.0).collect();
        if n > 3 {
            row[n / 2] = f32::NAN;
        }
        let want = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(row_max(&row).to_bits(), want.to_bits(), "n {n}");
    }
}
