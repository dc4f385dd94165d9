//! What `tnn quantize` can produce: a whole-file target type (llama.cpp's `llama_ftype`).

use std::fmt;

use tinynn_format::GgmlType;

/// A whole-file quantization target. Each names the tensor type most weights get and the
/// `general.file_type` recorded in the output; the per-tensor exceptions are in [`super::policy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    /// Mostly Q4_K (llama.cpp's Q4_K_S: a few attn_v / ffn_down tensors get Q5_K).
    Q4KS,
    /// Mostly Q5_K (llama.cpp's Q5_K_S).
    Q5KS,
    Q6K,
    /// Q4_K with Q6_K for half of attn_v and ffn_down (llama.cpp's Q4_K_M).
    Q4KM,
    /// Q5_K with Q6_K for half of attn_v and ffn_down (llama.cpp's Q5_K_M).
    Q5KM,
    /// Q2_K with Q3_K (or Q4_K) attn_v and Q3_K ffn_down / attn_output (llama.cpp's Q2_K).
    Q2K,
    /// Q3_K throughout (llama.cpp's Q3_K_S).
    Q3KS,
    /// Q3_K with Q4_K/Q5_K attn_v, Q4_K/Q5_K ffn_down, Q4_K attn_output (llama.cpp's Q3_K_M).
    Q3KM,
    /// Q3_K with Q5_K attn_v, ffn_down and attn_output (llama.cpp's Q3_K_L).
    Q3KL,
}

impl Target {
    /// Every target, in the order `tnn quantize --help` lists them.
    pub const ALL: [Target; 17] = [
        Target::F32,
        Target::F16,
        Target::Bf16,
        Target::Q8_0,
        Target::Q4_0,
        Target::Q4_1,
        Target::Q5_0,
        Target::Q5_1,
        Target::Q4KS,
        Target::Q5KS,
        Target::Q6K,
        Target::Q4KM,
        Target::Q5KM,
        Target::Q2K,
        Target::Q3KS,
        Target::Q3KM,
        Target::Q3KL,
    ];

    /// The name users type (`Q3_K`, `Q4_K` and `Q5_K` are accepted for the `_M` mixes, see
    /// [`Target::parse`]).
    pub fn name(self) -> &'static str {
        match self {
            Target::F32 => "F32",
            Target::F16 => "F16",
            Target::Bf16 => "BF16",
            Target::Q8_0 => "Q8_0",
            Target::Q4_0 => "Q4_0",
            Target::Q4_1 => "Q4_1",
            Target::Q5_0 => "Q5_0",
            Target::Q5_1 => "Q5_1",
            Target::Q4KS => "Q4_K_S",
            Target::Q5KS => "Q5_K_S",
            Target::Q6K => "Q6_K",
            Target::Q4KM => "Q4_K_M",
            Target::Q5KM => "Q5_K_M",
            Target::Q2K => "Q2_K",
            Target::Q3KS => "Q3_K_S",
            Target::Q3KM => "Q3_K_M",
            Target::Q3KL => "Q3_K_L",
        }
    }

    /// Parses a target name, case-insensitively. The plain K names are aliases of the `_M`
    /// mixes, as `llama-quantize` reads them: `Q3_K` is `Q3_K_M`, `Q4_K` is `Q4_K_M` and `Q5_K`
    /// is `Q5_K_M`.
    pub fn parse(name: &str) -> Option<Target> {
        let upper = name.to_ascii_uppercase();
        match upper.as_str() {
            "Q3_K" => return Some(Target::Q3KM),
            "Q4_K" => return Some(Target::Q4KM),
            "Q5_K" => return Some(Target::Q5KM),
            _ => {}
        }
        Target::ALL.into_iter().find(|t| t.name() == upper)
    }

    /// The valid names, for error messages.
    pub fn names() -> String {
        let mut v: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
        v.extend(["Q3_K", "Q4_K", "Q5_K"]);
        v.join(", ")
    }

    /// llama.cpp's `llama_ftype` id, written as `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            Target::F32 => 0,
            Target::F16 => 1,
            Target::Q4_0 => 2,
            Target::Q4_1 => 3,
            Target::Q8_0 => 7,
            Target::Q2K => 10,
            Target::Q3KS => 11,
            Target::Q3KM => 12,
            Target::Q3KL => 13,
            Target::Q5_0 => 8,
            Target::Q5_1 => 9,
            Target::Q4KS => 14,
            Target::Q4KM => 15,
            Target::Q5KS => 16,
            Target::Q5KM => 17,
            Target::Q6K => 18,
            Target::Bf16 => 32,
        }
    }

    /// The type a quantizable tensor gets unless a rule says otherwise.
    pub fn default_type(self) -> GgmlType {
        match self {
            Target::F32 => GgmlType::F32,
            Target::F16 => GgmlType::F16,
            Target::Bf16 => GgmlType::Bf16,
            Target::Q8_0 => GgmlType::Q8_0,
            Target::Q4_0 => GgmlType::Q4_0,
            Target::Q4_1 => GgmlType::Q4_1,
            Target::Q5_0 => GgmlType::Q5_0,
            Target::Q5_1 => GgmlType::Q5_1,
            Target::Q4KS | Target::Q4KM => GgmlType::Q4K,
            Target::Q5KS | Target::Q5KM => GgmlType::Q5K,
            Target::Q6K => GgmlType::Q6K,
            Target::Q2K => GgmlType::Q2K,
            Target::Q3KS | Target::Q3KM | Target::Q3KL => GgmlType::Q3K,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinynn_format::gguf::file_type_name;

    #[test]
    fn names_parse_back_and_file_types_agree_with_the_gguf_table() {
        for t in Target::ALL {
            assert_eq!(Target::parse(t.name()), Some(t));
            assert_eq!(Target::parse(&t.name().to_lowercase()), Some(t));
            // The file-type table names each target the way users spell it.
            assert_eq!(file_type_name(u64::from(t.file_type())), Some(t.name()));
        }
        assert_eq!(Target::parse("q4_k"), Some(Target::Q4KM));
        assert_eq!(Target::parse("Q5_K"), Some(Target::Q5KM));
        assert_eq!(Target::parse("Q3_K"), Some(Target::Q3KM));
        assert_eq!(Target::parse("q3_k_l"), Some(Target::Q3KL));
        assert_eq!(Target::parse("Q2_K_S"), None);
        assert_eq!(Target::parse("Q8_1"), None);
    }
}
