//! The scale searches behind the K-quant reference quantizers (ggml's `make_qx_quants`,
//! `make_q3_quants`, `make_qkx2_quants` and the Q4_K/Q5_K super-block step), written so that every
//! f32 operation happens in the same order as ggml's C: the quantized bytes are identical.
//!
//! Points that matter for bit-exactness:
//! - all arithmetic is f32; C's `int` operands are converted to f32 where C converts them
//!   (`w*x*l` is `(w * x) * l as f32`, `w*l*l` is `(w * l as f32) * l as f32`);
//! - accumulations run in index order, one scalar accumulator each;
//! - rounding is [`nearest_int`], ggml's `x + 1.5·2²³` trick (round half to even), reproduced
//!   bit for bit, including what it yields for inf/NaN;
//! - divisions stay divisions (`(x + dm) / d`) and reciprocals stay `1 / x`.

use super::half::F16Le;
use super::k_common::{scale_min_k4, QK_K};

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this are treated as zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: adds 1.5·2²³ so the FPU rounds to an integer (ties to even), then reads
/// the integer back from the mantissa bits. Equal to `round_ties_even` for |x| < 2²², and like C
/// for anything else (e.g. +inf gives −2²², NaN gives 0), so degenerate blocks quantize the same.
#[inline]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// The f32 an f16 field will hold (ggml re-reads its stored scales before the final pass).
#[inline]
pub(crate) fn f16_round(x: f32) -> (F16Le, f32) {
    let h = F16Le::from_f32(x);
    (h, h.get())
}

/// The value of largest magnitude (first one on ties), and that magnitude.
fn signed_abs_max(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (max, amax)
}

/// ggml's `make_qx_quants` with `rmse_type = 1` and no importance weights (what Q6_K uses):
/// symmetric quantization of `x` to `l ∈ [0, 2·nmax)` (stored with offset `nmax`) and a scale.
///
/// Starts from `iscale = −nmax / max` (`max` the signed value of largest magnitude), computes
/// the weighted least-squares scale `Σ w·x·l / Σ w·l²` with weights `w = x²`, then tries 18
/// neighbouring `iscale = −(nmax + 0.1·is) / max` (`is = −9..=9`, not 0) and keeps the one with
/// the largest `(Σ w·x·l)² / Σ w·l²`. An all-(near-)zero group gives `l = 0` and scale 0.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let clamp = |v: f32| nearest_int(v).clamp(-nmax, nmax - 1);
    // One pass at a given inverse scale: (Σ w·x·l, Σ w·l²).
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &xi in x {
            let l = clamp(iscale * xi) as f32;
            let w = xi * xi;
            sumlx += w * xi * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let fill = |iscale: f32, l_out: &mut [i8]| {
        for (o, &xi) in l_out.iter_mut().zip(x) {
            *o = (nmax + clamp(iscale * xi)) as i8;
        }
    };

    let iscale = -nmaxf / max;
    fill(iscale, l_out);
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmaxf + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            fill(iscale, l_out);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants` with `do_rmse = true` (Q3_K's sub-block search): `l ∈ [−nmax, nmax)`
/// from `iscale = −nmax / max`, then up to 5 sweeps of coordinate descent. Each sweep visits
/// every element, proposes the `l` that is optimal for it given the others' sums
/// (`x·Σ' w·l² / Σ' w·x·l`, weights `w = x²`) and accepts it if it raises
/// `(Σ w·x·l)² / Σ w·l²`; sweeps stop early when nothing changes. Returns
/// `Σ w·x·l / Σ w·l²` with `l_out` offset by `nmax`; an all-(near-)zero group gives `l = 0`
/// (no offset) and scale 0.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8]) -> f32 {
    let (max, amax) = signed_abs_max(x);
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (o, &xi) in l_out.iter_mut().zip(x) {
        let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1);
        *o = l as i8;
        let (w, l) = (xi * xi, l as f32);
        sumlx += w * xi * l;
        suml2 += w * l * l;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (o, &xi) in l_out.iter_mut().zip(x) {
            let w = xi * xi;
            let li = f32::from(*o);
            let mut slx = sumlx - w * xi * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(xi * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*o) {
                    let nl = new_l as f32;
                    slx += w * xi * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *o = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for o in l_out.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of ggml's `make_qkx2_quants` grid search.
pub(crate) struct Qkx2 {
    /// Largest quantized value (`l ∈ [0, nmax]`).
    pub nmax: i32,
    /// First tried `iscale` is `(rmin + nmax) / (max − min)`, then steps of `rdelta`.
    pub rmin: f32,
    pub rdelta: f32,
    /// Number of steps after the first (`nstep + 1` candidates).
    pub nstep: i32,
    /// Error metric: weighted |diff| (true, Q2_K) or weighted diff² (false, Q4_K/Q5_K).
    pub use_mad: bool,
}

/// ggml's `make_qkx2_quants`: asymmetric quantization `x ≈ scale·l − the_min` with
/// `l ∈ [0, nmax]` and `the_min ≥ 0` (the group minimum, capped at 0, is the offset).
///
/// The first guess spans `[min, max]` exactly. Then for each candidate
/// `iscale = (rmin + rdelta·is + nmax) / (max − min)` it rounds, solves the weighted
/// least-squares fit of scale and offset for those `l` (offset forced to 0 if the fit wants it
/// positive), and keeps the candidate with the smallest weighted error. Returns
/// `(scale, the_min)`; `l_out` holds the chosen `l`. A group with `max == min` (after capping
/// `min` at 0) gives `l = 0` and scale 0.
pub(crate) fn make_qkx2_quants(
    p: &Qkx2,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
) -> (f32, f32) {
    let n = x.len();
    let nmax = p.nmax;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let error = |diff: f32| if p.use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * error(diff);
    }
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=p.nstep {
        iscale = (p.rmin + p.rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let (w, l) = (weights[i], l as f32);
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * error(diff);
            }
            if cur_error < best_error {
                l_out.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// A quantized Q4_K/Q5_K super-block before the values' bits are packed.
pub(crate) struct QkxSuperBlock {
    pub d: F16Le,
    pub dmin: F16Le,
    /// Q4_K/Q5_K's 12-byte packing of the 6-bit scales and mins.
    pub scales: [u8; 12],
    /// The quantized values, `0..=nmax`.
    pub l: [u8; QK_K],
}

/// What Q4_K and Q5_K share: 8 sub-blocks of 32, each fitted by [`make_qkx2_quants`] with
/// weights `sqrt(mean x²) + |x|`; scales and mins quantized to 6 bits against the largest of
/// each (`d = max_scale / 63`, `dmin = max_min / 63`, stored as f16); then every value is
/// re-quantized against the stored f16 scales, `l = round((x + dmin·m) / (d·sc))` clamped to
/// `[0, nmax]` (sub-blocks whose effective scale is 0 keep the search's `l`).
pub(crate) fn quantize_qkx_super_block(x: &[f32], p: &Qkx2) -> QkxSuperBlock {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; QK_K / 32];
    let mut mins = [0f32; QK_K / 32];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut weights = [0f32; 32];
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * (j + 1)];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(p, xs, &weights, &mut l[32 * j..32 * (j + 1)]);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..QK_K / 32 {
        // C stores nearest_int's result in a uint8_t (wrapping), then caps it at 63.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let (d, d_f) = f16_round(max_scale / 63.0);
    let (dmin, dmin_f) = f16_round(max_min / 63.0);

    for j in 0..QK_K / 32 {
        let (sc, m) = scale_min_k4(j, &packed);
        let dj = d_f * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dmin_f * m as f32;
        for ii in 32 * j..32 * (j + 1) {
            l[ii] = nearest_int((x[ii] + dm) / dj).clamp(0, p.nmax) as u8;
        }
    }
    QkxSuperBlock {
        d,
        dmin,
        scales: packed,
        l,
    }
}

/// Packs 256 two-bit values as Q2_K/Q3_K store them: byte `32h + i` of each 128-element half
/// `h` holds elements `i`, `i+32`, `i+64`, `i+96` of that half in bits 0-1, 2-3, 4-5, 6-7.
pub(crate) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; 64]) {
    for (q, l) in qs.chunks_exact_mut(32).zip(l.chunks_exact(128)) {
        for i in 0..32 {
            q[i] = l[i] | (l[i + 32] << 2) | (l[i + 64] << 4) | (l[i + 96] << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_is_round_half_even_and_c_like_out_of_range() {
        for (x, want) in [
            (0.5, 0),
            (1.5, 2),
            (-2.5, -2),
            (2.6, 3),
            (-0.4, 0),
            (4194303.0, 4194303),
        ] {
            assert_eq!(nearest_int(x), want, "{x}");
        }
        assert_eq!(nearest_int(f32::INFINITY), -0x40_0000);
        assert_eq!(nearest_int(f32::NAN), 0);
    }

    #[test]
    fn qkx2_recovers_an_exact_grid() {
        // x = 0.5·l − 1 for l in 0..=15: the fit finds scale 0.5, min 1 and the exact l.
        let x: Vec<f32> = (0..32).map(|i| 0.5 * (i % 16) as f32 - 1.0).collect();
        let w = [1.0f32; 32];
        let mut l = [0u8; 32];
        let p = Qkx2 {
            nmax: 15,
            rmin: -1.0,
            rdelta: 0.1,
            nstep: 20,
            use_mad: false,
        };
        let (scale, min) = make_qkx2_quants(&p, &x, &w, &mut l);
        assert_eq!((scale, min), (0.5, 1.0));
        assert!(l.iter().enumerate().all(|(i, &q)| usize::from(q) == i % 16));
    }
}
