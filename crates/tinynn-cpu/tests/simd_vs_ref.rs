//! Every SIMD dot-product kernel against the scalar reference, for every instruction set this
//! CPU has, on rows of 1 to 33 blocks.

mod common;

use common::{weight_bytes, Rng};
use tinynn_core::quant::{self, SUPPORTED};
use tinynn_cpu::simd::{dot_fn_for, Isa};

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
    if Isa::available().contains(&Isa::Avx2) {
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
    if Isa::available().contains(&Isa::Avx512Vnni) {
        for must in [
            "Q4_K/avx512-vnni",
            "Q6_K/avx512-vnni",
            "Q5_K/avx512-vnni",
            "Q3_K/avx512-vnni",
            "Q2_K/avx512-vnni",
        ] {
            assert!(tested.iter().any(|t| t == must), "{must} missing");
        }
    }
}
