//! ggml tensor type ids and their block layouts, as stored in GGUF files.
//!
//! The reader recognizes every type ggml defines; whether the engine can compute with a type is
//! decided by later layers. Ids that ggml removed have no layout and are rejected by the reader.

use std::fmt;

/// Declares `GgmlType` and its tables from one row per type:
/// variant = type id, ggml name, elements per block, bytes per block.
macro_rules! ggml_types {
    ($($variant:ident = $id:literal, $name:literal, $block_elems:literal, $block_bytes:literal;)*) => {
        /// A ggml tensor element type (the `type` field of a GGUF tensor info).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u32)]
        pub enum GgmlType {
            $($variant = $id,)*
        }

        impl GgmlType {
            /// Every type, in id order.
            pub const ALL: &'static [GgmlType] = &[$(GgmlType::$variant,)*];

            /// The name ggml prints for this type (`Q4_K`, `IQ2_XXS`, `BF16`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $(GgmlType::$variant => $name,)*
                }
            }

            /// Elements per block and bytes per block, as ggml's type traits define them.
            pub fn layout(self) -> BlockLayout {
                let (block_elems, block_bytes) = match self {
                    $(GgmlType::$variant => ($block_elems, $block_bytes),)*
                };
                BlockLayout { block_elems, block_bytes }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 18;
    Q4_1 = 3, "Q4_1", 32, 20;
    Q5_0 = 6, "Q5_0", 32, 22;
    Q5_1 = 7, "Q5_1", 32, 24;
    Q8_0 = 8, "Q8_0", 32, 34;
    Q8_1 = 9, "Q8_1", 32, 36;
    Q2K = 10, "Q2_K", 256, 84;
    Q3K = 11, "Q3_K", 256, 110;
    Q4K = 12, "Q4_K", 256, 144;
    Q5K = 13, "Q5_K", 256, 176;
    Q6K = 14, "Q6_K", 256, 210;
    Q8K = 15, "Q8_K", 256, 292;
    Iq2Xxs = 16, "IQ2_XXS", 256, 66;
    Iq2Xs = 17, "IQ2_XS", 256, 74;
    Iq3Xxs = 18, "IQ3_XXS", 256, 98;
    Iq1S = 19, "IQ1_S", 256, 50;
    Iq4Nl = 20, "IQ4_NL", 32, 18;
    Iq3S = 21, "IQ3_S", 256, 110;
    Iq2S = 22, "IQ2_S", 256, 82;
    Iq4Xs = 23, "IQ4_XS", 256, 136;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    Iq1M = 29, "IQ1_M", 256, 56;
    Bf16 = 30, "BF16", 1, 2;
    Tq1_0 = 34, "TQ1_0", 256, 54;
    Tq2_0 = 35, "TQ2_0", 256, 66;
    Mxfp4 = 39, "MXFP4", 32, 17;
    Nvfp4 = 40, "NVFP4", 64, 36;
    Q1_0 = 41, "Q1_0", 128, 18;
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

    /// Looks a type up by its ggml name (case-insensitive).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// True for block-quantized types (more than one element per block).
    pub fn is_quantized(self) -> bool {
        self.layout().block_elems > 1
    }

    /// Bytes needed for `n_elements` elements whose rows are `row_len` long, or `None` when the row
    /// length is not a whole number of blocks or the size overflows.
    pub fn bytes_for(self, row_len: u64, n_elements: u64) -> Option<u64> {
        let l = self.layout();
        if !row_len.is_multiple_of(l.block_elems) {
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
        for &t in GgmlType::ALL {
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
