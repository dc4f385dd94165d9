//! Text ↔ token ids for GGUF models, built on Hugging Face's `tokenizers` from the vocabulary,
//! merges and pre-tokenizer name in the file's metadata.
//!
//! SentencePiece BPE (`tokenizer.ggml.model = llama`), and byte-level BPE (`gpt2`) with the
//! pre-tokenizer splits llama.cpp uses
//! for `tokenizer.ggml.pre`: `smollm` (digits one by one, then GPT-2's pattern), `llama-bpe`
//! (Llama 3) and `qwen2`; other names fall back to GPT-2's pattern. Control tokens are special
//! tokens: they are matched in text and never split.

use tinynn_format::gguf::{Array, Gguf, Key};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

use crate::{ModelError, Result};

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_LLAMA3` split.
pub(crate) const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_QWEN2` split (single digits).
pub(crate) const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token types of `tokenizer.ggml.token_type`.
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

pub struct Tokenizer {
    inner: HfTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    add_bos: bool,
    /// `tokenizer.json` brings its own post-processor (which adds BOS itself).
    own_specials: bool,
}

fn hf_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid(format!("tokenizer: {e}"))
}

impl Tokenizer {
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer> {
        match g.get_str(Key::TokenizerModel)? {
            Some("gpt2") => {}
            Some("llama") => return Tokenizer::sentencepiece_from_gguf(g),
            other => {
                return Err(ModelError::Invalid(format!(
                    "tokenizer model {other:?} is not supported yet (gpt2 and llama are)"
                )))
            }
        }
        let Some(Array::String(tokens)) = g.get_array(Key::TokenizerTokens)? else {
            return Err(ModelError::Invalid(
                "tokenizer.ggml.tokens is missing".into(),
            ));
        };
        let Some(Array::String(merges)) = g.get_array(Key::TokenizerMerges)? else {
            return Err(ModelError::Invalid(
                "tokenizer.ggml.merges is missing".into(),
            ));
        };
        let types: Vec<i32> = match g.get_array(Key::TokenizerTokenType)? {
            Some(Array::I32(t)) => t.clone(),
            _ => vec![1; tokens.len()],
        };
        let vocab: tokenizers::models::bpe::Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                let s = t
                    .as_str()
                    .ok_or_else(|| ModelError::Invalid(format!("token {i} is not UTF-8")))?;
                Ok((s.to_string(), i as u32))
            })
            .collect::<Result<_>>()?;
        let mut pairs = Vec::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            let s = m
                .as_str()
                .ok_or_else(|| ModelError::Invalid(format!("merge {i} is not UTF-8")))?;
            let (a, b) = s
                .split_once(' ')
                .ok_or_else(|| ModelError::Invalid(format!("merge {i} ({s:?}) is not a pair")))?;
            pairs.push((a.to_string(), b.to_string()));
        }
        let pre = g.get_str(Key::TokenizerPre)?.unwrap_or("default");
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, pairs)
            .ignore_merges(pre == "llama-bpe")
            .build()
            .map_err(hf_err)?;
        let mut inner = HfTokenizer::new(bpe);
        let byte_level = ByteLevel::new(false, true, true);
        let split = |pattern: &str| -> Result<PreTokenizerWrapper> {
            let split = Split::new(
                SplitPattern::Regex(pattern.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(hf_err)?;
            Ok(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into())
        };
        let pre_tokenizer: PreTokenizerWrapper = match pre {
            // llama.cpp's LLAMA_VOCAB_PRE_TYPE_SMOLLM: `\p{N}` pieces first, then GPT-2's
            // pattern within each stretch (so "\n\n  0" is "\n\n  " + "0"; plain GPT-2
            // splitting, which transformers' GGUF loader uses, gives "\n\n " + " " + "0").
            // It is also SmolLM2's own tokenizer.json pre-tokenizer; ByteLevel's extra `\s+`
            // alternative only names the whitespace pieces llama.cpp leaves unmatched.
            "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into(),
            "llama-bpe" => split(LLAMA3_SPLIT)?,
            "qwen2" => split(QWEN2_SPLIT)?,
            _ => byte_level.into(),
        };
        inner.with_pre_tokenizer(Some(pre_tokenizer));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let special: Vec<AddedToken> = tokens
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_CONTROL || t == TOKEN_USER_DEFINED)
            .filter_map(|(tok, &t)| {
                tok.as_str()
                    .map(|s| AddedToken::from(s.to_string(), t == TOKEN_CONTROL))
            })
            .collect();
        inner.add_special_tokens(&special);
        let id = |k| special_id(g, k, tokens.len());
        Ok(Tokenizer {
            inner,
            bos: id(Key::TokenizerBosId)?,
            eos: id(Key::TokenizerEosId)?,
            eot: id(Key::TokenizerEotId)?,
            add_bos: g.get_bool(Key::TokenizerAddBos)?.unwrap_or(false),
            own_specials: false,
        })
    }

    /// SentencePiece BPE (`tokenizer.ggml.model = llama`: Llama 2, TinyLlama, Mistral): pieces
    /// with scores, `▁` for spaces (and one in front when `add_space_prefix`), unknown bytes
    /// through `<0xXX>` pieces. Merges are every split of a piece into two pieces, ranked by the
    /// merged piece's score, which is how SentencePiece's BPE decides.
    fn sentencepiece_from_gguf(g: &Gguf) -> Result<Tokenizer> {
        use tokenizers::decoders::byte_fallback::ByteFallback;
        use tokenizers::decoders::fuse::Fuse;
        use tokenizers::decoders::sequence::Sequence as DecoderSequence;
        use tokenizers::decoders::strip::Strip;
        use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};

        let Some(Array::String(tokens)) = g.get_array(Key::TokenizerTokens)? else {
            return Err(ModelError::Invalid(
                "tokenizer.ggml.tokens is missing".into(),
            ));
        };
        let scores: Vec<f32> = match g.get_array(Key::TokenizerScores)? {
            Some(Array::F32(s)) if s.len() == tokens.len() => s.clone(),
            _ => {
                return Err(ModelError::Invalid(
                    "tokenizer.ggml.scores is missing or the wrong length".into(),
                ))
            }
        };
        let types: Vec<i32> = match g.get_array(Key::TokenizerTokenType)? {
            Some(Array::I32(t)) if t.len() == tokens.len() => t.clone(),
            _ => vec![1; tokens.len()],
        };
        let pieces: Vec<&str> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                t.as_str()
                    .ok_or_else(|| ModelError::Invalid(format!("token {i} is not UTF-8")))
            })
            .collect::<Result<_>>()?;
        let vocab: tokenizers::models::bpe::Vocab = pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), i as u32))
            .collect();
        // Every split of a piece into two pieces is a merge. Work and memory grow with the
        // square of a piece's length, so pieces, merges and the merges' bytes are capped far
        // above real vocabularies (Llama 2: pieces of at most 16 characters, ~1 MB of merges).
        let mut merges: Vec<(f32, u32, &str, &str)> = Vec::new();
        let mut merge_bytes = 0usize;
        for (i, piece) in pieces.iter().enumerate() {
            if types[i] != 1 && types[i] != TOKEN_USER_DEFINED {
                continue;
            }
            if piece.len() > MAX_PIECE_BYTES {
                return Err(ModelError::Invalid(format!(
                    "tokenizer.ggml.tokens: piece {i} is {} bytes, more than the limit of {MAX_PIECE_BYTES}",
                    piece.len()
                )));
            }
            for (at, _) in piece.char_indices().skip(1) {
                let (a, b) = piece.split_at(at);
                if vocab.contains_key(a) && vocab.contains_key(b) {
                    merges.push((scores[i], i as u32, a, b));
                    merge_bytes += piece.len();
                }
            }
            if merges.len() > MAX_MERGES || merge_bytes > MAX_MERGE_BYTES {
                return Err(ModelError::Invalid(format!(
                    "tokenizer.ggml.tokens: the pieces up to {i} split into {} merges of {merge_bytes} bytes, more than the limits of {MAX_MERGES} merges and {MAX_MERGE_BYTES} bytes",
                    merges.len()
                )));
            }
        }
        merges.sort_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
        let merges = merges
            .into_iter()
            .map(|(_, _, a, b)| (a.to_string(), b.to_string()))
            .collect();
        let id = |k| special_id(g, k, tokens.len());
        let unk = id(Key::TokenizerUnknownId)?;
        let mut builder = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .byte_fallback(true)
            .fuse_unk(true);
        if let Some(u) = unk.and_then(|u| pieces.get(u as usize)) {
            builder = builder.unk_token(u.to_string());
        }
        let mut inner = HfTokenizer::new(builder.build().map_err(hf_err)?);
        let prefix = g
            .get_raw("tokenizer.ggml.add_space_prefix")
            .and_then(|v| v.as_bool())
            .unwrap_or(true);
        let mut norm: Vec<tokenizers::NormalizerWrapper> = Vec::new();
        if prefix {
            norm.push(Prepend::new("\u{2581}".into()).into());
        }
        norm.push(Replace::new(" ", "\u{2581}").map_err(hf_err)?.into());
        inner.with_normalizer(Some(NormalizerSequence::new(norm)));
        let mut dec: Vec<tokenizers::DecoderWrapper> = vec![
            Replace::new("\u{2581}", " ").map_err(hf_err)?.into(),
            ByteFallback::default().into(),
            Fuse::default().into(),
        ];
        if prefix {
            dec.push(Strip::new(' ', 1, 0).into());
        }
        inner.with_decoder(Some(DecoderSequence::new(dec)));
        let special: Vec<AddedToken> = pieces
            .iter()
            .zip(&types)
            .filter(|(_, &t)| t == TOKEN_CONTROL || t == TOKEN_USER_DEFINED)
            .map(|(p, &t)| AddedToken::from(p.to_string(), t == TOKEN_CONTROL))
            .collect();
        inner.add_special_tokens(&special);
        Ok(Tokenizer {
            inner,
            bos: id(Key::TokenizerBosId)?,
            eos: id(Key::TokenizerEosId)?,
            eot: id(Key::TokenizerEotId)?,
            add_bos: g.get_bool(Key::TokenizerAddBos)?.unwrap_or(true),
            own_specials: false,
        })
    }

    /// A Hugging Face `tokenizer.json`; `bos`/`eos` come from the model's config.
    pub fn from_hf_file(
        path: &std::path::Path,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<Tokenizer> {
        let len = std::fs::metadata(path)
            .map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?
            .len();
        if len > tinynn_format::model_dir::MAX_JSON_BYTES {
            return Err(ModelError::Invalid(format!(
                "{}: {len} bytes is too large for a tokenizer",
                path.display()
            )));
        }
        let inner = read_hf_tokenizer(path)?;
        // Ids index tables (`token_strings`, the model's rows): a huge or very sparse id would
        // size them from one number in the file.
        let vocab = inner.get_vocab(true);
        let (n, max) = (
            vocab.len() as u64,
            vocab.values().copied().max().unwrap_or(0),
        );
        if u64::from(max) >= 2 * n.max(1) {
            return Err(ModelError::Invalid(format!(
                "{}: token id {max} in a vocabulary of {n} tokens (ids must be dense)",
                path.display()
            )));
        }
        for (what, id) in [("bos_token_id", bos), ("eos_token_id", eos)] {
            if let Some(id) = id.filter(|&i| inner.id_to_token(i).is_none()) {
                return Err(ModelError::Invalid(format!(
                    "{}: the config's {what} {id} is not a token of the tokenizer",
                    path.display()
                )));
            }
        }
        Ok(Tokenizer {
            inner,
            bos,
            eos,
            eot: None,
            add_bos: false,
            own_specials: true,
        })
    }

    /// This tokenizer as a Hugging Face `tokenizer.json` (how a GGUF vocabulary is written
    /// into a HF directory): the same model, pre-tokenizer, decoder and special tokens, and a
    /// post-processor that puts BOS in front when the GGUF file asks for it.
    pub fn to_hf_json(&self) -> Result<String> {
        use tokenizers::processors::template::TemplateProcessing;
        let mut t = self.inner.clone();
        if let (true, false, Some(bos)) = (self.add_bos, self.own_specials, self.bos) {
            let s = t
                .id_to_token(bos)
                .ok_or_else(|| hf_err(format!("BOS {bos} is not a token")))?;
            if s.is_empty() || s.contains(char::is_whitespace) || s.contains(['$', ':']) {
                return Err(hf_err(format!(
                    "BOS {s:?} cannot be written in a post-processor template"
                )));
            }
            let bos_first = TemplateProcessing::builder()
                .try_single(format!("{s} $A"))
                .map_err(hf_err)?
                .try_pair(format!("{s} $A {s} $B:1"))
                .map_err(hf_err)?
                .special_tokens(vec![(s, bos)])
                .build()
                .map_err(hf_err)?;
            t.with_post_processor(Some(bos_first));
        }
        t.to_string(true).map_err(hf_err)
    }

    /// Every token's string, by id (for byte-level detokenization).
    pub fn token_strings(&self) -> Vec<String> {
        let vocab = self.inner.get_vocab(true);
        let mut out =
            vec![String::new(); vocab.values().map(|&i| i as usize + 1).max().unwrap_or(0)];
        for (s, i) in vocab {
            out[i as usize] = s;
        }
        out
    }

    /// Token ids of `text`; with `special`, BOS is prepended when the model asks for it.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, special && self.own_specials)
            .map_err(hf_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if special && self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text of `ids` (special tokens included as their text).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(hf_err)
    }

    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The BOS token that [`Tokenizer::encode`] puts first with `special`, if it adds one.
    pub fn added_bos(&self) -> Option<u32> {
        self.bos.filter(|_| self.add_bos)
    }

    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// The tokens that end generation (EOS, EOT), each once.
    pub fn end_tokens(&self) -> Vec<u32> {
        let mut ends: Vec<u32> = self.eos.into_iter().chain(self.eot).collect();
        ends.dedup();
        ends
    }

    /// True for tokens that end generation (EOS, EOT).
    pub fn is_end(&self, id: u32) -> bool {
        Some(id) == self.eos || Some(id) == self.eot
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// The text of generated tokens as they come, through the tokenizer's own decoder
/// (`tokenizers`' streaming decode: each step decodes a short window of ids and hands out what
/// it adds to the window's text). So every vocabulary decodes as its `tokenizer.json` or GGUF
/// says — byte-level BPE, SentencePiece's `▁` and byte pieces, WordPiece's `##`, Unigram —
/// and a UTF-8 character split over tokens waits until it is whole.
#[derive(Clone, Debug, Default)]
pub struct TextStream {
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

impl TextStream {
    /// The text `id` adds ("" while a character or a decoder's context is incomplete).
    pub fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<String> {
        let got = tokenizers::tokenizer::step_decode_stream(
            &tok.inner,
            vec![id],
            false,
            &mut self.ids,
            &mut self.prefix,
            &mut self.prefix_index,
        )
        .map_err(hf_err)?;
        Ok(got.unwrap_or_default())
    }

    /// What is held back at the end (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self, tok: &Tokenizer) -> Result<String> {
        let ids = std::mem::take(&mut self.ids);
        let prefix = std::mem::take(&mut self.prefix);
        self.prefix_index = 0;
        if ids.is_empty() {
            return Ok(String::new());
        }
        let all = tok.inner.decode(&ids, false).map_err(hf_err)?;
        Ok(all
            .strip_prefix(prefix.as_str())
            .map(str::to_string)
            .unwrap_or_default())
    }
}

impl Tokenizer {
    /// How single tokens read as bytes, from the decoder the tokenizer declares (not from the
    /// look of its pieces): byte-level, SentencePiece (`▁`, byte pieces), WordPiece (`##`), or
    /// plain.
    pub fn vocab_kind(&self) -> crate::vocab::VocabKind {
        use crate::vocab::VocabKind;
        use tokenizers::DecoderWrapper as D;
        fn kinds(d: &D, out: &mut Vec<VocabKind>) {
            match d {
                D::Sequence(seq) => seq.get_decoders().iter().for_each(|d| kinds(d, out)),
                D::ByteLevel(_) => out.push(VocabKind::ByteLevelBpe),
                D::WordPiece(_) => out.push(VocabKind::WordPiece),
                D::Metaspace(_) | D::ByteFallback(_) | D::Replace(_) => {
                    out.push(VocabKind::SentencePiece)
                }
                _ => {}
            }
        }
        let mut found = Vec::new();
        if let Some(d) = self.inner.get_decoder() {
            kinds(d, &mut found);
        }
        [
            VocabKind::ByteLevelBpe,
            VocabKind::WordPiece,
            VocabKind::SentencePiece,
        ]
        .into_iter()
        .find(|k| found.contains(k))
        .unwrap_or(VocabKind::Plain)
    }

    /// A [`TextStream`] for tokens that follow `context` (the prompt): its last few tokens
    /// seed the window, so the first generated token reads as it does after them (a
    /// SentencePiece decoder strips the space of a text's first word, not of a continuation).
    pub fn text_stream(&self, context: &[u32]) -> TextStream {
        let tail = &context[context.len().saturating_sub(4)..];
        match self.inner.decode(tail, false) {
            Ok(prefix) if !tail.is_empty() && !prefix.ends_with('\u{fffd}') => TextStream {
                ids: tail.to_vec(),
                prefix,
                prefix_index: tail.len(),
            },
            _ => TextStream::default(),
        }
    }
}

/// Longest SentencePiece piece (bytes) a vocabulary may have.
pub const MAX_PIECE_BYTES: usize = 1024;
/// Most merges a SentencePiece vocabulary may imply, and their total bytes.
pub const MAX_MERGES: usize = 1 << 22;
pub const MAX_MERGE_BYTES: usize = 64 << 20;

/// The special-token id under `key`, which must name a token of the `n_tokens` the file
/// lists (an id past them, or one a `u32` cannot hold, is an error rather than a truncation).
fn special_id(g: &Gguf, key: Key, n_tokens: usize) -> Result<Option<u32>> {
    match g.get_u64(key)? {
        None => Ok(None),
        Some(v) if v < n_tokens as u64 => Ok(Some(v as u32)),
        Some(v) => Err(ModelError::Invalid(format!(
            "{} is {v}, which is not a token id: the vocabulary has {n_tokens} tokens",
            key.resolve("")
        ))),
    }
}

/// The `tokenizers` library's reading of a `tokenizer.json`. The text must be JSON first (an
/// error then says where it is not). The library itself panics on some malformed files (a
/// syntax error inside the `decoder` object, a bad precompiled normalizer map: found by the
/// `tokenizer_json` fuzz target), so its reading runs under `catch_unwind` and a panic is this
/// file's error.
fn read_hf_tokenizer(path: &std::path::Path) -> Result<HfTokenizer> {
    let bad = |what: String| ModelError::Invalid(format!("{}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
        return Err(bad(format!("not valid JSON: {e}")));
    }
    match std::panic::catch_unwind(|| text.parse::<HfTokenizer>()) {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(bad(e.to_string())),
        Err(payload) => {
            let why = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(bad(format!(
                "the tokenizers library could not read it ({why}); the file is malformed"
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fuzz_seed(name: &str) -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/corpus/tokenizer_json")
            .join(name)
    }

    /// Files the `tokenizers` library panics on are errors here, each naming the file.
    #[test]
    fn tokenizer_json_files_that_panic_the_library_are_errors() {
        let e = Tokenizer::from_hf_file(&fuzz_seed("crash-decoder-syntax.json"), None, None)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("not valid JSON"), "{e}");
        assert!(e.to_string().contains("crash-decoder-syntax.json"), "{e}");
        let e = Tokenizer::from_hf_file(&fuzz_seed("bad-precompiled.json"), None, None)
            .err()
            .expect("refused");
        assert!(e.to_string().contains("could not read it"), "{e}");
        // The same file with a sound normalizer reads.
        assert!(Tokenizer::from_hf_file(&fuzz_seed("wordpiece.json"), None, None).is_ok());
    }
}
