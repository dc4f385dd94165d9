//! ggml tensor type ids and their block layouts, as stored in GGUF files.
//!
//! The reader recognizes every type ggml defines; whether the engine can compute with a type is
//! decided by later layers. Ids that ggml removed have no layout and are rejected by the reader.

use std::fmt;

/// A ggml tensor element type (the `type` field of a GGUF tensor info).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2K = 10,
    Q3K = 11,
    Q4K = 12,
    Q5K = 13,
    Q6K = 14,
    Q8K = 15,
    Iq2Xxs = 16,
    Iq2Xs = 17,
    Iq3Xxs = 18,
    Iq1S = 19,
    Iq4Nl = 20,
    Iq3S = 21,
    Iq2S = 22,
    Iq4Xs = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    Iq1M = 29,
    Bf16 = 30,
    Tq1_0 = 34,
    Tq2_0 = 35,
    Mxfp4 = 39,
    Nvfp4 = 40,
    Q1_0 = 41,
}

/// How a type stores its elements: `block_elems` elements share one `block_bytes`-byte block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockLayout {
    pub block_elems: u64,
    pub block_bytes: u64,
}

/// What an id read from a file means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TypeId {
    Known(GgmlType),
    /// An id ggml used once and then removed (its files cannot be read by current ggml either).
    Removed(&'static str),
    Unknown(u32),
}

impl GgmlType {
    /// Every type, in id order.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::Iq2Xxs,
        GgmlType::Iq2Xs,
        GgmlType::Iq3Xxs,
        GgmlType::Iq1S,
        GgmlType::Iq4Nl,
        GgmlType::Iq3S,
        GgmlType::Iq2S,
        GgmlType::Iq4Xs,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::Iq1M,
        GgmlType::Bf16,
        GgmlType::Tq1_0,
        GgmlType::Tq2_0,
        GgmlType::Mxfp4,
        GgmlType::Nvfp4,
        GgmlType::Q1_0,
    ];

    /// Interprets a type id read from a file.
    pub fn from_id(id: u32) -> TypeId {
        if let Some(t) = GgmlType::ALL.iter().find(|t| t.id() == id) {
            return TypeId::Known(*t);
        }
        match id {
            4 => TypeId::Removed("Q4_2"),
            5 => TypeId::Removed("Q4_3"),
            31 => TypeId::Removed("Q4_0_4_4"),
            32 => TypeId::Removed("Q4_0_4_8"),
            33 => TypeId::Removed("Q4_0_8_8"),
            36 => TypeId::Removed("IQ4_NL_4_4"),
            37 => TypeId::Removed("IQ4_NL_4_8"),
            38 => TypeId::Removed("IQ4_NL_8_8"),
            _ => TypeId::Unknown(id),
        }
    }

    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name ggml prints for this type (`Q4_K`, `IQ2_XXS`, `BF16`, ...).
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2K => "Q2_K",
            Q3K => "Q3_K",
            Q4K => "Q4_K",
            Q5K => "Q5_K",
            Q6K => "Q6_K",
            Q8K => "Q8_K",
            Iq2Xxs => "IQ2_XXS",
            Iq2Xs => "IQ2_XS",
            Iq3Xxs => "IQ3_XXS",
            Iq1S => "IQ1_S",
            Iq4Nl => "IQ4_NL",
            Iq3S => "IQ3_S",
            Iq2S => "IQ2_S",
            Iq4Xs => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            Iq1M => "IQ1_M",
            Bf16 => "BF16",
            Tq1_0 => "TQ1_0",
            Tq2_0 => "TQ2_0",
            Mxfp4 => "MXFP4",
            Nvfp4 => "NVFP4",
            Q1_0 => "Q1_0",
        }
    }

    /// Looks a type up by its ggml name (case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block and bytes per block, as ggml's type traits define them.
    pub fn layout(self) -> BlockLayout {
        use GgmlType::*;
        let (block_elems, block_bytes) = match self {
            F32 | I32 => (1, 4),
            F16 | Bf16 | I16 => (1, 2),
            I8 => (1, 1),
            I64 | F64 => (1, 8),
            Q4_0 => (32, 18),
            Q4_1 => (32, 20),
            Q5_0 => (32, 22),
            Q5_1 => (32, 24),
            Q8_0 => (32, 34),
            Q8_1 => (32, 36),
            Iq4Nl => (32, 18),
            Mxfp4 => (32, 17),
            Nvfp4 => (64, 36),
            Q1_0 => (128, 18),
            Q2K => (256, 84),
            Q3K => (256, 110),
            Q4K => (256, 144),
            Q5K => (256, 176),
            Q6K => (256, 210),
            Q8K => (256, 292),
            Iq2Xxs => (256, 66),
            Iq2Xs => (256, 74),
            Iq3Xxs => (256, 98),
            Iq1S => (256, 50),
            Iq3S => (256, 110),
            Iq2S => (256, 82),
            Iq4Xs => (256, 136),
            Iq1M => (256, 56),
            Tq1_0 => (256, 54),
            Tq2_0 => (256, 66),
        };
        BlockLayout {
            block_elems,
            block_bytes,
        }
    }

    /// True for block-quantized types (more than one element per block).
    pub fn is_quantized(self) -> bool {
        self.layout().block_elems > 1
    }

    /// Bytes needed for `n_elements` elements whose rows are `row_len` long, or `None` when the row
    /// length is not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, row_len: u64, n_elements: u64) -> Option<u64> {
        let l = self.layout();
        if row_len % l.block_elems != 0 {
            return None;
        }
        (n_elements / l.block_elems).checked_mul(l.block_bytes)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), TypeId::Known(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), TypeId::Removed("Q4_2"));
        assert_eq!(GgmlType::from_id(1000), TypeId::Unknown(1000));
    }

    #[test]
    fn layouts_match_ggml_block_structs() {
        // Sizes as the C structs add up: e.g. Q4_K = d + dmin (2 f16) + 12 scale bytes + 128 nibble bytes.
        assert_eq!(GgmlType::Q4K.layout().block_bytes, 2 + 2 + 12 + 128);
        assert_eq!(GgmlType::Q6K.layout().block_bytes, 128 + 64 + 16 + 2);
        assert_eq!(GgmlType::Q8K.layout().block_bytes, 4 + 256 + 2 * 16);
        assert_eq!(GgmlType::Q4_1.layout().block_bytes, 2 + 2 + 16);
        assert_eq!(GgmlType::Q8_1.layout().block_bytes, 2 + 2 + 32);
        assert_eq!(GgmlType::Q4_1.bytes_for(64, 128), Some(80));
        assert_eq!(GgmlType::Q4_1.bytes_for(48, 96), None);
    }
}
