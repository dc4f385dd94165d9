//! The architectures tinynn knows, one registry line each ([`REGISTRY`]): their names in GGUF
//! files and HF configs, how their GGUF q/k rows are laid out for RoPE, their HF tensor names,
//! their decoder (one file in this folder, written on `crate::common`'s pieces and used by
//! inference and training alike), and whether `tnn quantize` and the trainer take them.
//!
//! Everything that needs to know which architectures exist asks here: hyperparameters
//! ([`Hparams::from_config`]), HF weight names (`crate::weights`), the quantizer
//! (`crate::quantize`), the trainer (`tinynn_train`), and the CLI's `tnn train` and
//! `tnn inspect`.

pub mod decoder;
pub mod gemma;
pub mod gpt2;
pub mod gptneox;
pub mod hf_names;
pub mod hparams;
pub mod llama;
pub mod mamba;
pub mod phi3;

pub use decoder::{declare, logits, softcap, trunk, Decoder, Embedded, TensorDecl};
pub use hparams::{ArchDefaults, Hparams, SlidingWindow, SsmHparams};

use std::borrow::Cow;

use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::Rearrange;

use crate::quantize::policy::{Class70b, QuantRules};
use crate::{ModelError, Result};

/// The GGUF tensor an HF tensor is a part of, and the part's index (`Arch::hf_stacked`).
pub type StackedParts = fn(&str) -> Option<(String, usize)>;

/// A rewrite of one tensor between transformers' and llama.cpp's forms: (GGUF name, ggml
/// dims, values), changed in place.
pub type Rewrite = fn(&str, &mut Vec<usize>, &mut [f32]);

/// One supported architecture.
pub struct Arch {
    /// `general.architecture` in GGUF files (and `ModelConfig::architecture`'s name).
    pub name: &'static str,
    /// `model_type` values of HF `config.json` files.
    pub hf_model_types: &'static [&'static str],
    /// llama.cpp's converter permutes this architecture's q/k rows for RoPE on adjacent pairs:
    /// RoPE is NORMAL on GGUF weights and NEOX on HF ones. False: NEOX on both.
    pub gguf_qk_permuted: bool,
    /// The HF tensor name of a GGUF tensor name.
    pub hf_name: fn(&str) -> Option<Cow<'static, str>>,
    /// The HF tensors stored in another layout than GGUF's (GPT-2's `Conv1D` weights
    /// `[in, out]`, GPT-NeoX's per-head interleaved q/k/v), by HF name, and how to rearrange
    /// them; an HF directory's copies are rearranged once, on first use.
    pub hf_rearranged: Option<fn(&str, &ModelConfig) -> Option<Rearrange>>,
    /// The HF tensors that are parts of one GGUF tensor (Mixtral's per-expert matrices of
    /// `ffn_*_exps`), by HF name: the GGUF name and the part's index. An HF directory's
    /// parts are stacked once, on first use.
    pub hf_stacked: Option<StackedParts>,
    /// Its embeddings, blocks, final norm and head.
    pub decoder: &'static dyn Decoder,
    /// `tnn quantize`'s rules for it; `None`: not quantized.
    pub quantize: Option<QuantRules>,
    /// The trainer (`tnn finetune`, `tnn train`) takes it.
    pub train: bool,
    /// llama.cpp's converter stores its norm weights as `1 + w` (transformers' Gemma norms
    /// multiply by `1 + w` and store `w`).
    pub gguf_norm_plus_one: bool,
    /// Other per-tensor rewrites llama.cpp's converter makes (Mamba's `A = −exp(A_log)`),
    /// and their inverse for export to transformers' layout.
    pub gguf_rewrite: Option<(Rewrite, Rewrite)>,
}

impl std::fmt::Debug for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arch")
            .field("name", &self.name)
            .field("hf_model_types", &self.hf_model_types)
            .field("gguf_qk_permuted", &self.gguf_qk_permuted)
            .field("quantize", &self.quantize)
            .field("train", &self.train)
            .finish_non_exhaustive()
    }
}

/// Every supported architecture. Adding one: its decoder in `arch/<name>.rs`, a line here,
/// and a reference test against transformers.
pub static REGISTRY: &[Arch] = &[
    Arch {
        name: "llama",
        // llama.cpp's converter writes Mixtral as a Llama with experts.
        hf_model_types: &["llama", "mixtral"],
        gguf_qk_permuted: true,
        hf_name: llama::hf_name,
        hf_rearranged: None,
        hf_stacked: Some(llama::hf_stacked),
        decoder: &llama::LLAMA,
        quantize: Some(QuantRules {
            class_70b: Class70b::Layers80Gqa,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "mistral",
        hf_model_types: &["mistral"],
        gguf_qk_permuted: true,
        hf_name: llama::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &llama::MISTRAL,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "qwen2",
        hf_model_types: &["qwen2"],
        gguf_qk_permuted: false,
        hf_name: llama::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &llama::QWEN2,
        quantize: Some(QuantRules {
            class_70b: Class70b::Layers80,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "qwen3",
        hf_model_types: &["qwen3"],
        gguf_qk_permuted: false,
        hf_name: llama::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &llama::QWEN3,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "gemma",
        hf_model_types: &["gemma"],
        gguf_qk_permuted: false,
        hf_name: gemma::hf_name_gemma1,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &gemma::GEMMA,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: true,
        gguf_rewrite: None,
    },
    Arch {
        name: "gemma2",
        hf_model_types: &["gemma2"],
        gguf_qk_permuted: false,
        hf_name: gemma::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &gemma::GEMMA2,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: true,
        gguf_rewrite: None,
    },
    Arch {
        name: "gemma3",
        hf_model_types: &["gemma3_text", "gemma3"],
        gguf_qk_permuted: false,
        hf_name: gemma::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &gemma::GEMMA3,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: true,
        gguf_rewrite: None,
    },
    Arch {
        name: "gpt2",
        hf_model_types: &["gpt2"],
        gguf_qk_permuted: false,
        hf_name: gpt2::hf_name,
        hf_rearranged: Some(gpt2::hf_rearranged),
        hf_stacked: None,
        decoder: &gpt2::GPT2,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "gptneox",
        hf_model_types: &["gpt_neox"],
        gguf_qk_permuted: false,
        hf_name: gptneox::hf_name,
        hf_rearranged: Some(gptneox::hf_rearranged),
        hf_stacked: None,
        decoder: &gptneox::GPTNEOX,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "phi3",
        hf_model_types: &["phi3"],
        gguf_qk_permuted: false,
        hf_name: phi3::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &phi3::PHI3,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: None,
    },
    Arch {
        name: "mamba",
        hf_model_types: &["mamba"],
        gguf_qk_permuted: false,
        hf_name: mamba::hf_name,
        hf_rearranged: None,
        hf_stacked: None,
        decoder: &mamba::MAMBA,
        quantize: Some(QuantRules {
            class_70b: Class70b::Never,
        }),
        train: true,
        gguf_norm_plus_one: false,
        gguf_rewrite: Some((mamba::gguf_from_hf, mamba::hf_from_gguf)),
    },
];

/// The architecture with GGUF name `name`.
pub fn by_name(name: &str) -> Option<&'static Arch> {
    REGISTRY.iter().find(|a| a.name == name)
}

/// The architecture of HF `model_type` `t`.
pub fn by_hf_model_type(t: &str) -> Option<&'static Arch> {
    REGISTRY.iter().find(|a| a.hf_model_types.contains(&t))
}

/// The architecture of `c`, or [`ModelError::UnsupportedArchitecture`].
pub fn of_config(c: &ModelConfig) -> Result<&'static Arch> {
    let name = c.architecture.name();
    by_name(name).ok_or_else(|| ModelError::UnsupportedArchitecture(name.to_string()))
}

/// The architecture of `c` when the trainer takes it, else
/// [`ModelError::NotTrainable`] (or `UnsupportedArchitecture`).
pub fn for_training(c: &ModelConfig) -> Result<&'static Arch> {
    let arch = of_config(c)?;
    if !arch.train {
        return Err(ModelError::NotTrainable(arch.name.to_string()));
    }
    Ok(arch)
}

/// The GGUF names of the architectures `keep` accepts, comma-separated (for messages).
pub fn names(keep: fn(&Arch) -> bool) -> String {
    REGISTRY
        .iter()
        .filter(|a| keep(a))
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

impl Arch {
    /// What tinynn does with it: `run`, `train`, `quantize`.
    pub fn capabilities(&self) -> Vec<&'static str> {
        let mut out = vec!["run"];
        if self.train {
            out.push("train");
        }
        if self.quantize.is_some() {
            out.push("quantize");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for (i, a) in REGISTRY.iter().enumerate() {
            assert_eq!(by_name(a.name).map(|b| b.name), Some(a.name));
            for t in a.hf_model_types {
                assert_eq!(by_hf_model_type(t).map(|b| b.name), Some(a.name));
            }
            assert!(REGISTRY[..i].iter().all(|b| b.name != a.name));
        }
        assert_eq!(
            names(|_| true),
            "llama, mistral, qwen2, qwen3, gemma, gemma2, gemma3, gpt2, gptneox, phi3, mamba"
        );
        assert!(by_name("rwkv6").is_none());
    }

    #[test]
    fn unsupported_architectures_list_the_supported_ones() {
        let e = ModelError::UnsupportedArchitecture("rwkv6".into()).to_string();
        assert!(
            e.contains("'rwkv6'") && e.contains("llama, mistral, qwen2, qwen3"),
            "{e}"
        );
    }
}
