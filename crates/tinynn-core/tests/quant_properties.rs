//! Error bounds and consistency of every format: quantize→dequantize error within ggml's
//! published bounds (tests/test-quantize-fns.cpp: same data, same metric), vec_dot equal to
//! dequantize-then-f32, and clear errors for bad rows.

use tinynn_core::quant::{
    dequantize_row, has_quantizer, quantize_row, row_bytes, vec_dot, vec_dot_type, QuantError,
    SUPPORTED,
};
use tinynn_format::GgmlType;

const N: usize = 32 * 128;

/// ggml's synthetic test data: `0.1 + 2 cos(i + offset)`.
fn synthetic(offset: f32) -> Vec<f32> {
    (0..N)
        .map(|i| 0.1 + 2.0 * (i as f32 + offset).cos())
        .collect()
}

/// ggml's `array_rmse`: sqrt(Σ diff²) / n.
fn ggml_rmse(a: &[f32], b: &[f32]) -> f64 {
    let sum: f64 = a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum();
    sum.sqrt() / a.len() as f64
}

fn quantized(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; row_bytes(ty, x.len()).unwrap()];
    quantize_row(ty, x, &mut q).unwrap();
    q
}

fn dequantized(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    dequantize_row(ty, q, &mut out).unwrap();
    out
}

/// Types with a quantizer, and ggml's bound for each: MAX_QUANTIZATION_TOTAL_ERROR (0.002),
/// or the looser _2BITS (0.0075) and _3BITS (0.0040) bounds for Q2_K and Q3_K.
const QUANTIZERS: [(GgmlType, f64); 15] = [
    (GgmlType::F32, 0.0),
    (GgmlType::F16, 0.002),
    (GgmlType::Bf16, 0.002),
    (GgmlType::Q4_0, 0.002),
    (GgmlType::Q4_1, 0.002),
    (GgmlType::Q5_0, 0.002),
    (GgmlType::Q5_1, 0.002),
    (GgmlType::Q8_0, 0.002),
    (GgmlType::Q8_1, 0.002),
    (GgmlType::Q2K, 0.0075),
    (GgmlType::Q3K, 0.0040),
    (GgmlType::Q4K, 0.002),
    (GgmlType::Q5K, 0.002),
    (GgmlType::Q6K, 0.002),
    (GgmlType::Q8K, 0.002),
];

#[test]
fn round_trip_error_within_ggml_bounds() {
    let x = synthetic(0.0);
    for (ty, bound) in QUANTIZERS {
        let back = dequantized(ty, &quantized(ty, &x), N);
        let err = ggml_rmse(&x, &back);
        assert!(err <= bound, "{ty}: total error {err} > {bound}");
        eprintln!("{ty:>5}: ggml total error {err:.6} (bound {bound})");
    }
}

#[test]
fn requantizing_a_dequantized_row_is_stable() {
    // Dequantized values lie on the grid, so quantizing them again gives back the same blocks.
    let x = synthetic(1.0);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::F16,
        GgmlType::Bf16,
    ] {
        let q = quantized(ty, &x);
        let again = quantized(ty, &dequantized(ty, &q, N));
        let back1 = dequantized(ty, &q, N);
        let back2 = dequantized(ty, &again, N);
        let drift = ggml_rmse(&back1, &back2);
        assert!(drift <= 1e-4, "{ty}: requantization drift {drift}");
    }
}

/// Weights for every supported weight type: synthetic data through its quantizer (every
/// supported type has one).
fn weights(ty: GgmlType, seed: u64) -> Vec<u8> {
    assert!(has_quantizer(ty), "{ty} has no quantizer");
    quantized(ty, &synthetic(seed as f32))
}

#[test]
fn vec_dot_equals_dequantize_then_dot() {
    let y = synthetic(7.0);
    for ty in SUPPORTED {
        let dot_ty = vec_dot_type(ty).unwrap();
        let x = weights(ty, 3);
        let yq = quantized(dot_ty, &y);
        let got = f64::from(vec_dot(ty, N, &x, &yq).unwrap());
        let (xf, yf) = (dequantized(ty, &x, N), dequantized(dot_ty, &yq, N));
        let want: f64 = xf
            .iter()
            .zip(&yf)
            .map(|(&a, &b)| f64::from(a) * f64::from(b))
            .sum();
        let scale: f64 = xf
            .iter()
            .zip(&yf)
            .map(|(&a, &b)| f64::from(a * b).abs())
            .sum();
        // f32 accumulation over 4096 products; f16-stored partial sums (Q8_1's s) add a little more.
        let tol = 1e-3 * scale.max(1e-6);
        assert!(
            (got - want).abs() <= tol,
            "{ty}·{dot_ty}: vec_dot {got}, dequantized dot {want}"
        );
    }
}

#[test]
fn vec_dot_error_against_f32_within_ggml_bounds() {
    // ggml's MAX_DOT_PRODUCT_ERROR: |quantized dot − f32 dot| / n ≤ 0.02.
    let (x, y) = (synthetic(0.0), synthetic(1.0));
    let exact: f64 = x
        .iter()
        .zip(&y)
        .map(|(&a, &b)| f64::from(a) * f64::from(b))
        .sum();
    for (ty, _) in QUANTIZERS {
        let dot_ty = vec_dot_type(ty).unwrap();
        let got = f64::from(vec_dot(ty, N, &quantized(ty, &x), &quantized(dot_ty, &y)).unwrap());
        let err = (got - exact).abs() / N as f64;
        assert!(err <= 0.02, "{ty}: dot product error {err}");
    }
}

#[test]
fn bad_rows_are_clear_errors() {
    let mut out = vec![0f32; 33];
    assert!(matches!(
        dequantize_row(GgmlType::Q4_0, &[0; 18], &mut out),
        Err(QuantError::PartialBlock { .. })
    ));
    let mut out = vec![0f32; 32];
    let e = dequantize_row(GgmlType::Q4_0, &[0; 17], &mut out).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Q4_0: source holds 17 bytes, 32 elements need 18"
    );
    assert_eq!(
        dequantize_row(GgmlType::Iq2Xxs, &[0; 66], &mut [0.0; 256]),
        Err(QuantError::Unsupported(GgmlType::Iq2Xxs))
    );
    assert_eq!(
        quantize_row(GgmlType::Iq2Xxs, &[0.0; 256], &mut [0; 66]),
        Err(QuantError::Unsupported(GgmlType::Iq2Xxs))
    );
    assert!(matches!(
        quantize_row(GgmlType::Q4K, &[0.0; 256], &mut [0; 143]),
        Err(QuantError::WrongLength { need: 144, .. })
    ));
    assert!(
        vec_dot(GgmlType::Q4_1, 32, &[0; 20], &[0; 34]).is_err(),
        "y must be Q8_1 (36 bytes)"
    );
    assert_eq!(vec_dot_type(GgmlType::Q4K), Ok(GgmlType::Q8K));
    assert_eq!(vec_dot_type(GgmlType::Q4_1), Ok(GgmlType::Q8_1));
    assert_eq!(vec_dot_type(GgmlType::Q4_0), Ok(GgmlType::Q8_0));
}
