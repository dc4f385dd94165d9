//! Error measures for comparing results with their references, written so that a NaN anywhere
//! makes the measure NaN (and so fails every `measure < tolerance` check). `f32::max` and
//! `f64::max` return the other operand when one is NaN, so a fold over them silently skips a
//! NaN difference; these do not.

/// The larger of `a` and `b`, or NaN when either is NaN (for folds over differences).
pub fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// `max |x|` over `a` (0 for an empty slice; NaN when any element is NaN).
pub fn max_abs(a: &[f32]) -> f64 {
    a.iter().map(|&x| f64::from(x).abs()).fold(0.0, nan_max)
}

/// `max |a_i − b_i|` (NaN when any difference is NaN). Panics when the lengths differ.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0.0, nan_max)
}

/// `max |a − b| / max |b|` (the plain difference when `b` is all zeros; NaN when any element of
/// either is NaN).
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    let (diff, scale) = (max_abs_diff(a, b), max_abs(b));
    if scale == 0.0 {
        diff
    } else {
        diff / scale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_anywhere_makes_the_measure_nan() {
        let good = [1.0f32, -2.0, 3.0];
        assert_eq!(max_abs_diff(&good, &[1.0, -2.5, 3.0]), 0.5);
        assert_eq!(rel_err(&good, &[1.0, -2.0, 4.0]), 0.25);
        assert_eq!(max_abs(&good), 3.0);
        for i in 0..3 {
            let mut bad = good;
            bad[i] = f32::NAN;
            assert!(max_abs_diff(&bad, &good).is_nan());
            assert!(max_abs_diff(&good, &bad).is_nan());
            assert!(rel_err(&bad, &good).is_nan());
            assert!(rel_err(&good, &bad).is_nan());
            assert!(max_abs(&bad).is_nan());
            // What a tolerance check then says.
            let within_tolerance = rel_err(&bad, &good) < 1e-3;
            assert!(!within_tolerance);
        }
        // The trap these avoid: f64::max drops a NaN.
        assert_eq!([0.5, f64::NAN, 0.25].into_iter().fold(0.0, f64::max), 0.5);
        assert!([0.5, f64::NAN, 0.25]
            .into_iter()
            .fold(0.0, nan_max)
            .is_nan());
        // Infinities are ordinary values.
        assert_eq!(max_abs_diff(&[f32::INFINITY], &[0.0]), f64::INFINITY);
    }
}
