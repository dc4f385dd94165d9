//! f16 and bf16 conversions exactly as ggml performs them.

/// IEEE half → f32 (exact).
#[inline]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 → IEEE half, round to nearest even (what F16C hardware and ggml do).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// bf16 → f32 (exact: the high half of an f32).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 → bf16 as ggml rounds it: NaN stays a quiet NaN, everything else rounds to nearest even.
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// A little-endian f16 stored as two bytes (keeps block structs byte-aligned).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(transparent)]
pub struct F16Le(pub [u8; 2]);

impl F16Le {
    #[inline]
    pub fn get(self) -> f32 {
        f16_to_f32(u16::from_le_bytes(self.0))
    }

    #[inline]
    pub fn from_f32(x: f32) -> F16Le {
        F16Le(f32_to_f16(x).to_le_bytes())
    }
}

/// ggml's `nearest_int`: round half to even (valid for |x| < 2^22, the range quantizers use).
#[inline]
pub fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounding_matches_ggml() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to even (down here).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x7fc0_0001)) & 0x7fc0, 0x7fc0);
        assert_eq!(bf16_to_f32(0xc000), -2.0);
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(
            [
                nearest_int(0.5),
                nearest_int(1.5),
                nearest_int(-2.5),
                nearest_int(2.6)
            ],
            [0, 2, -2, 3]
        );
    }
}
