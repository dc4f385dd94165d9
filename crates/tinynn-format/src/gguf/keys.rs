//! Well-known GGUF metadata keys as an enum, so callers never spell key strings by hand.
//!
//! Keys under an architecture (`llama.context_length`) are resolved against the file's
//! `general.architecture`.

use std::borrow::Cow;

/// Declares `Key`, `Key::ALL` and `Key::pattern` from one table of variant => stored key.
macro_rules! keys {
    ($($variant:ident => $pattern:literal,)*) => {
        /// A metadata key the engine knows the meaning of.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Key {
            $($variant,)*
        }

        impl Key {
            /// Every key, for listing and tests.
            pub const ALL: &'static [Key] = &[$(Key::$variant,)*];

            /// The key as stored, with `{arch}` standing for the architecture where the key has one.
            pub fn pattern(self) -> &'static str {
                match self {
                    $(Key::$variant => $pattern,)*
                }
            }
        }
    };
}

keys! {
    GeneralArchitecture => "general.architecture",
    GeneralName => "general.name",
    GeneralType => "general.type",
    GeneralAlignment => "general.alignment",
    GeneralFileType => "general.file_type",
    GeneralQuantizationVersion => "general.quantization_version",
    GeneralSizeLabel => "general.size_label",
    GeneralBaseModelName => "general.base_model.0.name",
    GeneralLicense => "general.license",
    ContextLength => "{arch}.context_length",
    EmbeddingLength => "{arch}.embedding_length",
    BlockCount => "{arch}.block_count",
    FeedForwardLength => "{arch}.feed_forward_length",
    VocabSize => "{arch}.vocab_size",
    ExpertCount => "{arch}.expert_count",
    ExpertUsedCount => "{arch}.expert_used_count",
    SsmConvKernel => "{arch}.ssm.conv_kernel",
    SsmInnerSize => "{arch}.ssm.inner_size",
    SsmStateSize => "{arch}.ssm.state_size",
    SsmTimeStepRank => "{arch}.ssm.time_step_rank",
    HeadCount => "{arch}.attention.head_count",
    HeadCountKv => "{arch}.attention.head_count_kv",
    KeyLength => "{arch}.attention.key_length",
    ValueLength => "{arch}.attention.value_length",
    LayerNormEpsilon => "{arch}.attention.layer_norm_epsilon",
    LayerNormRmsEpsilon => "{arch}.attention.layer_norm_rms_epsilon",
    SlidingWindow => "{arch}.attention.sliding_window",
    SlidingWindowPattern => "{arch}.attention.sliding_window_pattern",
    AttnLogitSoftcapping => "{arch}.attn_logit_softcapping",
    FinalLogitSoftcapping => "{arch}.final_logit_softcapping",
    UseParallelResidual => "{arch}.use_parallel_residual",
    RopeDimensionCount => "{arch}.rope.dimension_count",
    RopeFreqBase => "{arch}.rope.freq_base",
    RopeFreqBaseSwa => "{arch}.rope.freq_base_swa",
    RopeScalingType => "{arch}.rope.scaling.type",
    RopeScalingFactor => "{arch}.rope.scaling.factor",
    RopeScalingAttnFactor => "{arch}.rope.scaling.attn_factor",
    RopeScalingOriginalContextLength => "{arch}.rope.scaling.original_context_length",
    RopeScalingYarnBetaFast => "{arch}.rope.scaling.yarn_beta_fast",
    RopeScalingYarnBetaSlow => "{arch}.rope.scaling.yarn_beta_slow",
    TokenizerModel => "tokenizer.ggml.model",
    TokenizerPre => "tokenizer.ggml.pre",
    TokenizerTokens => "tokenizer.ggml.tokens",
    TokenizerTokenType => "tokenizer.ggml.token_type",
    TokenizerScores => "tokenizer.ggml.scores",
    TokenizerMerges => "tokenizer.ggml.merges",
    TokenizerBosId => "tokenizer.ggml.bos_token_id",
    TokenizerEosId => "tokenizer.ggml.eos_token_id",
    TokenizerEotId => "tokenizer.ggml.eot_token_id",
    TokenizerUnknownId => "tokenizer.ggml.unknown_token_id",
    TokenizerSeparatorId => "tokenizer.ggml.seperator_token_id",
    TokenizerPaddingId => "tokenizer.ggml.padding_token_id",
    TokenizerAddBos => "tokenizer.ggml.add_bos_token",
    TokenizerAddEos => "tokenizer.ggml.add_eos_token",
    TokenizerChatTemplate => "tokenizer.chat_template",
    SplitNo => "split.no",
    SplitCount => "split.count",
    SplitTensorsCount => "split.tensors.count",
    AdapterType => "adapter.type",
    AdapterLoraAlpha => "adapter.lora.alpha",
}

impl Key {
    pub fn is_arch_scoped(self) -> bool {
        self.pattern().starts_with("{arch}")
    }

    /// The key string for a file of architecture `arch`.
    pub fn resolve(self, arch: &str) -> Cow<'static, str> {
        let p = self.pattern();
        match p.strip_prefix("{arch}") {
            Some(rest) => Cow::Owned(format!("{arch}{rest}")),
            None => Cow::Borrowed(p),
        }
    }

    /// Recognizes a stored key string, given the file's architecture.
    pub fn parse(key: &str, arch: &str) -> Option<Key> {
        Key::ALL
            .iter()
            .copied()
            .find(|k| match k.pattern().strip_prefix("{arch}") {
                Some(rest) => key.strip_prefix(arch).is_some_and(|r| r == rest),
                None => k.pattern() == key,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_and_parse_agree() {
        for &k in Key::ALL {
            let s = k.resolve("qwen2");
            assert_eq!(Key::parse(&s, "qwen2"), Some(k), "{s}");
        }
        assert_eq!(Key::ContextLength.resolve("llama"), "llama.context_length");
        assert_eq!(Key::parse("llama.context_length", "qwen2"), None);
    }
}
