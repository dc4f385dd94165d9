//! Dot products of a weight row with an activation row, per weight format and instruction set.
//!
//! The instruction set is detected once ([`Isa::detected`], overridable with
//! `TINYNN_ISA=scalar|avx2|avx512`), and [`dot_fn`] hands out the best kernel for a format.
//! Every SIMD kernel has the scalar reference (`tinynn_core::quant::vec_dot`) as its oracle in
//! tests; formats without a SIMD kernel use that reference.

pub(crate) mod attention_back;
pub(crate) mod attention_block;
pub(crate) mod attention_f16;
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

/// Instruction sets with kernels, best last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F/BW/VL + VNNI (256-bit forms).
    Avx512Vnni,
}

impl Isa {
    /// The best instruction set this CPU has, or the one `TINYNN_ISA` asks for (never more
    /// than the CPU has).
    pub fn detected() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let best = Isa::available()
                .iter()
                .copied()
                .max()
                .unwrap_or(Isa::Scalar);
            match std::env::var("TINYNN_ISA").as_deref() {
                Ok("scalar") => Isa::Scalar,
                Ok("avx2") => best.min(Isa::Avx2),
                _ => best,
            }
        })
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
            if avx2 {
                out.push(Isa::Avx2);
                let vnni = is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni");
                // The kernels use AVX2/F16C helpers too; those were checked above.
                if vnni {
                    out.push(Isa::Avx512Vnni);
                }
            }
        }
        out
    }

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512-vnni",
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
            "{what} cannot run here (the CPU lacks it), so its test would pass without              testing anything; set TINYNN_ISA=avx2 or TINYNN_ISA=scalar to test a lower level              on purpose"
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
        #[cfg(not(target_arch = "x86_64"))]
        _ => None,
    }
}

/// The best kernel for `ty` on this CPU (falling back level by level to the reference).
pub fn dot_fn(ty: GgmlType) -> Option<DotFn> {
    let isa = Isa::detected();
    [Isa::Avx512Vnni, Isa::Avx2, Isa::Scalar]
        .into_iter()
        .filter(|&i| i <= isa)
        .find_map(|i| dot_fn_for(ty, i))
}

/// `x` (one weight row, whole blocks) · four activation rows: result `r` is, bit for bit, what
/// the [`DotFn`] of [`dot_fn`] gives for `x` and `y[r]`.
pub type Dot4Fn = fn(x: &[u8], y: [&[u8]; 4]) -> [f32; 4];

/// A four-row kernel for `ty`, where this CPU's one-row kernel for it has a four-row twin
/// (AVX2's Q4_0, Q4_1 and Q8_0, when they are the best this CPU runs for the format).
pub fn dot4_fn(ty: GgmlType) -> Option<Dot4Fn> {
    let isa = Isa::detected();
    #[cfg(target_arch = "x86_64")]
    let avx2_is_best = isa == Isa::Avx2 || (isa > Isa::Avx2 && avx512::dot_fn(ty).is_none());
    #[cfg(not(target_arch = "x86_64"))]
    let avx2_is_best = false;
    if isa >= Isa::Avx2 && avx2_is_best {
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
