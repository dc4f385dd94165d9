//! Dot products of a weight row with an activation row, per weight format and instruction set.
//!
//! The instruction set is detected once ([`Isa::detected`], overridable with
//! `TINYNN_ISA=scalar|avx2|avx512f|avx512vnni|avx512bf16`), and [`dot_fn`] hands out the best kernel for a format.
//! Every SIMD kernel has the scalar reference (`tinynn_core::quant::vec_dot`) as its oracle in
//! tests; formats without a SIMD kernel use that reference.

pub(crate) mod attention_back;
pub(crate) mod attention_block;
pub(crate) mod attention_f16;
#[cfg(target_arch = "x86_64")]
mod attention_f16_avx2;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_kquants;
#[cfg(target_arch = "x86_64")]
mod avx2_q5;
#[cfg(target_arch = "x86_64")]
mod avx2_rows4;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_kquants;
pub mod dropout;
pub(crate) mod gemm_f32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod hsum512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod lanes16;
pub use gemm_f32::{bf16_available, bf16_bits};
pub mod packed;
pub mod quantize_q8;
pub mod vexp;

pub mod f16_accumulate;

use std::sync::OnceLock;

use tinynn_core::quant;
use tinynn_format::GgmlType;

/// `x` (weight row, whole blocks) · `y` (activation row in the format's dot type). The caller
/// guarantees `y` holds as many elements as `x`, in the dot type's layout.
pub type DotFn = fn(x: &[u8], y: &[u8]) -> f32;

/// Instruction-set levels, best last; each level holds every feature of the ones below it.
/// What a level gates:
/// - `Avx2` (AVX2 + FMA + F16C): every fast path has a kernel here.
/// - `Avx512F` (AVX-512 F/BW/VL/DQ): the float kernels at 512 bits: the f32 GEMM, blocked
///   attention and its backward, the vector `exp`, the activation quantizers, f16 rows,
///   dropout, AdamW.
/// - `Avx512Vnni` (+ VNNI): the integer dot products at 512 bits: the packed tiles and the
///   row dots of the quantized formats (without VNNI they run their AVX2 twins).
/// - `Avx512Bf16` (+ BF16): the bf16 GEMM (`--bf16` training) and BF16 weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Avx512F,
    Avx512Vnni,
    Avx512Bf16,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512F,
        Isa::Avx512Vnni,
        Isa::Avx512Bf16,
    ];

    /// The best instruction set this CPU has, or the one `TINYNN_ISA` asks for (never more
    /// than the CPU has). `TINYNN_ISA` takes a level's [`name`](Isa::name), or `native`; any
    /// other value is reported on stderr and ignored.
    pub fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let best = Isa::available()
                .iter()
                .copied()
                .max()
                .unwrap_or(Isa::Scalar);
            match std::env::var("TINYNN_ISA") {
                Ok(want) => match Isa::parse_cap(&want) {
                    Some(cap) => best.min(cap),
                    None => {
                        eprintln!(
                            "tinynn: TINYNN_ISA={want:?} is not a level (scalar, avx2, avx512f, \
                             avx512vnni, avx512bf16, native); using {}",
                            best.name()
                        );
                        best
                    }
                },
                Err(_) => best,
            }
        })
    }

    /// The cap `TINYNN_ISA=value` asks for (`native` or empty: no cap); `None` for an unknown
    /// value.
    pub fn parse_cap(value: &str) -> Option<Isa> {
        let v = value.trim().to_ascii_lowercase();
        if v.is_empty() || v == "native" {
            return Some(Isa::Avx512Bf16);
        }
        Isa::ALL.into_iter().find(|isa| isa.name() == v)
    }

    /// Every instruction set this CPU can run (detected once).
    pub fn available() -> &'static [Isa] {
        static AVAILABLE: OnceLock<Vec<Isa>> = OnceLock::new();
        AVAILABLE.get_or_init(Isa::probe)
    }

    fn probe() -> Vec<Isa> {
        let mut out = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            // Each level needs the ones below (the 512-bit kernels use AVX2/F16C helpers too).
            let f = avx2
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512dq");
            let vnni = f && is_x86_feature_detected!("avx512vnni");
            let bf16 = vnni && is_x86_feature_detected!("avx512bf16");
            for (present, isa) in [
                (avx2, Isa::Avx2),
                (f, Isa::Avx512F),
                (vnni, Isa::Avx512Vnni),
                (bf16, Isa::Avx512Bf16),
            ] {
                if present {
                    out.push(isa);
                }
            }
        }
        out
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512F => "avx512f",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Avx512Bf16 => "avx512bf16",
        }
    }
}

/// For tests of kernels that need `what` (`present`: whether this run can use them): true when
/// they can be tested. When they cannot, a test must not pass without testing anything: this
/// panics, saying so, unless `TINYNN_ISA` is set — the run caps the instruction set on purpose
/// (`TINYNN_ISA=avx2` on an AVX-512 machine, or on a CPU without AVX-512 to test what it has);
/// then it says on stderr what goes untested and returns false.
pub fn required_by_test(what: &str, present: bool) -> bool {
    if present {
        return true;
    }
    match std::env::var("TINYNN_ISA") {
        Ok(cap) => {
            eprintln!("TINYNN_ISA={cap}: {what} not tested in this run");
            false
        }
        Err(_) => panic!(
            "{what} cannot run here (the CPU lacks it), so its test would pass without \
             testing anything; set TINYNN_ISA (scalar, avx2, avx512f, avx512vnni) to test a \
             lower level on purpose"
        ),
    }
}

/// The reference kernel (any supported format).
fn scalar(ty: GgmlType) -> Option<DotFn> {
    macro_rules! reference {
        ($($t:ident),*) => {
            match ty {
                $(GgmlType::$t => Some(|x: &[u8], y: &[u8]| {
                    let n = x.len() / GgmlType::$t.layout().block_bytes as usize * GgmlType::$t.layout().block_elems as usize;
                    quant::vec_dot(GgmlType::$t, n, x, y).unwrap_or(f32::NAN)
                }),)*
                _ => None,
            }
        };
    }
    reference!(F32, F16, Bf16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2K, Q3K, Q4K, Q5K, Q6K, Q8K)
}

/// The kernel for weight type `ty` on instruction set `isa`, if one exists at exactly that level.
pub fn dot_fn_for(ty: GgmlType, isa: Isa) -> Option<DotFn> {
    if !Isa::available().contains(&isa) {
        return None;
    }
    match isa {
        Isa::Scalar => scalar(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::dot_fn(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => avx512::dot_fn(ty),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Bf16 => avx512::bf16_dot_fn(ty),
        _ => None,
    }
}

/// The level whose kernel [`dot_fn`] hands out for `ty`: the best one, at or below
/// [`Isa::detected`], with a kernel for the format.
fn dot_level(ty: GgmlType) -> Option<Isa> {
    let isa = Isa::detected();
    Isa::ALL
        .into_iter()
        .rev()
        .filter(|&i| i <= isa)
        .find(|&i| dot_fn_for(ty, i).is_some())
}

/// The best kernel for `ty` on this CPU (falling back level by level to the reference).
pub fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    dot_level(ty).and_then(|isa| dot_fn_for(ty, isa))
}

/// `x` (one weight row, whole blocks) · four activation rows: result `r` is, bit for bit, what
/// the [`DotFn`] of [`dot_fn`] gives for `x` and `y[r]`.
pub type Dot4Fn = fn(x: &[u8], y: [&[u8]; 4]) -> [f32; 4];

/// A four-row kernel for `ty`, where this CPU's one-row kernel for it has a four-row twin
/// (AVX2's Q4_0, Q4_1 and Q8_0, when they are the best this CPU runs for the format).
pub fn dot4_fn(ty: GgmlType) -> Option<Dot4Fn> {
    if dot_level(ty) == Some(Isa::Avx2) {
        return dot4_fn_for(ty, Isa::Avx2);
    }
    None
}

/// The four-row twin of [`dot_fn_for`]`(ty, isa)`, where it has one and this CPU runs `isa`.
pub fn dot4_fn_for(ty: GgmlType, isa: Isa) -> Option<Dot4Fn> {
    if !Isa::available().contains(&isa) {
        return None;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2_rows4::dot4_fn(ty),
        _ => None,
    }
}

/// Asks the cache hierarchy for the `bytes` bytes at `p` (into L1) without waiting for them: a
/// hint only, for memory a loop will read soon in an order the hardware prefetcher cannot
/// guess. Does nothing off x86-64.
#[inline]
pub(crate) fn prefetch(p: *const u8, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(line) as *const i8,
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Stores the first `n` lanes of `v` at `p` (`n` ≥ 8: all of them): a plain store when all
/// are wanted, a masked one only for a partial row. AMD cores run a masked store to memory
/// (`vmaskmovps`) as a long microcoded sequence: in the AVX2 f32 GEMM tile it cost 5–11%.
///
/// # Safety
/// AVX2; the first `min(n, 8)` f32s at `p` are writable.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn store_first_lanes8(p: *mut f32, n: usize, v: std::arch::x86_64::__m256) {
    use std::arch::x86_64::*;
    // SAFETY: the lanes written are the first min(n, 8) (caller).
    unsafe {
        if n >= 8 {
            _mm256_storeu_ps(p, v);
        } else {
            let mask = _mm256_cmpgt_epi32(
                _mm256_set1_epi32(n as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            );
            _mm256_maskstore_ps(p, mask, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isa_caps_parse_by_name_and_unknown_values_are_refused() {
        for isa in Isa::ALL {
            assert_eq!(Isa::parse_cap(isa.name()), Some(isa));
            assert_eq!(Isa::parse_cap(&isa.name().to_uppercase()), Some(isa));
        }
        assert_eq!(Isa::parse_cap("native"), Some(Isa::Avx512Bf16));
        assert_eq!(Isa::parse_cap(""), Some(Isa::Avx512Bf16));
        for bad in ["avx512", "avx-512", "sse4", "avx512-vnni", "2"] {
            assert_eq!(Isa::parse_cap(bad), None, "{bad}");
        }
    }

    /// Levels are cumulative: a CPU at a level runs every level below it, and the detected
    /// level is one it runs.
    #[test]
    fn available_levels_are_a_prefix_of_all() {
        let avail = Isa::available();
        assert_eq!(avail, &Isa::ALL[..avail.len()]);
        assert!(avail.contains(&Isa::detected()));
        // What each gate reports follows the level.
        assert_eq!(bf16_available(), Isa::detected() >= Isa::Avx512Bf16);
        assert_eq!(vexp::available(), Isa::detected() >= Isa::Avx512F);
    }

    /// The row kernel handed out is the one of the best level at or below the detected one that
    /// has a kernel for the format; BF16 weights take the BF16 level's only where it runs.
    #[test]
    fn dot_fn_comes_from_the_best_level_with_a_kernel() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::F16,
            GgmlType::Bf16,
        ] {
            let level = dot_level(ty).unwrap();
            assert!(level <= Isa::detected());
            assert!(Isa::ALL
                .iter()
                .filter(|&&i| i > level && i <= Isa::detected())
                .all(|&i| dot_fn_for(ty, i).is_none()));
        }
        if Isa::detected() == Isa::Avx512F {
            // No VNNI: the quantized formats' row dots are AVX2's.
            assert_eq!(dot_level(GgmlType::Q4_1), Some(Isa::Avx2));
        }
        assert_eq!(
            dot_level(GgmlType::Bf16) == Some(Isa::Avx512Bf16),
            Isa::detected() == Isa::Avx512Bf16
        );
    }
}
