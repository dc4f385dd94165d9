//! A `tokenizer.json` vocabulary as llama.cpp's GGUF tokenizer keys:
//! - byte-level BPE (`tokenizer.ggml.model = gpt2`): the tokens by id, their types, the
//!   merges, the pre-tokenizer name llama.cpp knows it by, and whether a BOS is added;
//!   pre-tokenizers llama.cpp has no name for are refused rather than written wrong;
//! - SentencePiece BPE converted by transformers (`byte_fallback`, `▁` for spaces: Llama 2,
//!   Mistral, Gemma; `tokenizer.ggml.model = llama`): the pieces, their types (byte pieces
//!   `<0xXX>`, the unknown piece, control and user-defined tokens) and scores. A SentencePiece
//!   model merges the adjacent pair whose merged piece scores highest; transformers wrote its
//!   merges in that order, so a piece's score is minus the rank of the first merge that makes
//!   it. Whether a `▁` goes in front of the text (`add_space_prefix`) is read off the
//!   normalizer (`Prepend`) or the pre-tokenizer (`Metaspace`).

use serde_json::Value as Json;
use tinynn_format::gguf::{Array, GgufString, GgufWriter, Key, Value};

use crate::tokenizer::{LLAMA3_SPLIT, QWEN2_SPLIT};
use crate::{ModelError, Result};

/// `tokenizer.ggml.token_type` values.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// Most tokens a vocabulary may have (ids are below 2^31; the table is sized from them).
const MAX_TOKENS: usize = 1 << 24;

fn bad(what: impl std::fmt::Display) -> ModelError {
    ModelError::Invalid(format!("tokenizer.json: {what}"))
}

/// Writes the GGUF tokenizer keys of `json` (a parsed `tokenizer.json`) into `w`, with
/// `bos`/`eos` from the model's config. Returns the number of tokens.
pub fn write_vocab(
    w: &mut GgufWriter<'_>,
    json: &Json,
    bos: Option<u32>,
    eos: Option<u32>,
) -> Result<usize> {
    let model = json.get("model").ok_or_else(|| bad("no \"model\""))?;
    let kind = model.get("type").and_then(Json::as_str).unwrap_or("BPE");
    if kind != "BPE" {
        return Err(bad(format!(
            "a {kind} vocabulary is not converted (byte-level BPE is)"
        )));
    }
    let sentencepiece = model.get("byte_fallback").and_then(Json::as_bool) == Some(true);
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("model.vocab is not a map"))?;
    let added: Vec<(usize, String, bool)> = match json.get("added_tokens") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(a)) => a
            .iter()
            .map(|t| {
                let id = t.get("id").and_then(Json::as_u64);
                let content = t.get("content").and_then(Json::as_str);
                match (id, content) {
                    (Some(id), Some(c)) => Ok((
                        id as usize,
                        c.to_string(),
                        t.get("special").and_then(Json::as_bool).unwrap_or(false),
                    )),
                    _ => Err(bad(format!("added token {t} has no id or content"))),
                }
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(bad("added_tokens is not a list")),
    };
    let n = vocab.len() + added.len();
    if n > MAX_TOKENS {
        return Err(bad(format!("{n} tokens is more than {MAX_TOKENS}")));
    }
    // Every id below the count must be named exactly once.
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![NORMAL; n];
    let mut place = |id: usize, s: &str, ty: i32| -> Result<()> {
        let slot = tokens.get_mut(id).ok_or_else(|| {
            bad(format!(
                "token id {id} of {s:?} is not below the {n} tokens"
            ))
        })?;
        if slot.as_deref().is_some_and(|old| old != s) {
            return Err(bad(format!("token id {id} names both {slot:?} and {s:?}")));
        }
        *slot = Some(s.to_string());
        types[id] = ty;
        Ok(())
    };
    for (s, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(format!("the id of {s:?} is not a number")))?;
        place(id as usize, s, NORMAL)?;
    }
    for (id, s, special) in &added {
        place(*id, s, if *special { CONTROL } else { USER_DEFINED })?;
    }
    // Added tokens that repeat vocabulary entries leave the last ids unnamed.
    let named = tokens
        .iter()
        .rposition(Option::is_some)
        .map_or(0, |i| i + 1);
    tokens.truncate(named);
    types.truncate(named);
    if let Some(gap) = tokens.iter().position(Option::is_none) {
        return Err(bad(format!("no token has id {gap} (ids must be dense)")));
    }
    let merges: Vec<GgufString> = match model.get("merges") {
        None | Some(Json::Null) => Vec::new(),
        Some(Json::Array(m)) => m
            .iter()
            .map(|p| match p {
                Json::String(s) => Ok(GgufString::from(s.as_str())),
                Json::Array(pair) => match (pair.first(), pair.get(1), pair.len()) {
                    (Some(Json::String(a)), Some(Json::String(b)), 2) => {
                        Ok(GgufString::from(format!("{a} {b}")))
                    }
                    _ => Err(bad(format!("merge {p} is not a pair of strings"))),
                },
                _ => Err(bad(format!("merge {p} is not a string or a pair"))),
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(bad("model.merges is not a list")),
    };
    let add_bos = adds_bos(json.get("post_processor").unwrap_or(&Json::Null));
    let set = |w: &mut GgufWriter<'_>, k: Key, v: Value| {
        w.set(&k.resolve(""), v);
    };
    let tokens: Vec<String> = tokens.into_iter().map(Option::unwrap_or_default).collect();
    let n_tokens = tokens.len();
    if sentencepiece {
        let scores = piece_scores(&tokens, &merges);
        for (i, t) in tokens.iter().enumerate() {
            if types[i] == NORMAL && is_byte_piece(t) {
                types[i] = BYTE;
            }
        }
        if let Some(unk) = model.get("unk_token").and_then(Json::as_str) {
            let id = tokens.iter().position(|t| t == unk).ok_or_else(|| {
                bad(format!(
                    "the unknown token {unk:?} is not in the vocabulary"
                ))
            })?;
            types[id] = UNKNOWN;
            set(w, Key::TokenizerUnknownId, Value::U32(id as u32));
        }
        set(w, Key::TokenizerModel, Value::String("llama".into()));
        set(w, Key::TokenizerScores, Value::Array(Array::F32(scores)));
        w.set(
            "tokenizer.ggml.add_space_prefix",
            Value::Bool(adds_space_prefix(json)?),
        );
    } else {
        let pre = pre_name(json.get("pre_tokenizer").unwrap_or(&Json::Null))?;
        set(w, Key::TokenizerModel, Value::String("gpt2".into()));
        set(w, Key::TokenizerPre, Value::String(pre.into()));
        set(w, Key::TokenizerMerges, Value::Array(Array::String(merges)));
    }
    let tokens: Vec<GgufString> = tokens.into_iter().map(GgufString::from).collect();
    set(w, Key::TokenizerTokens, Value::Array(Array::String(tokens)));
    set(w, Key::TokenizerTokenType, Value::Array(Array::I32(types)));
    for (k, id) in [(Key::TokenizerBosId, bos), (Key::TokenizerEosId, eos)] {
        if let Some(id) = id {
            if id as usize >= n_tokens {
                return Err(bad(format!(
                    "the config's {} {id} is not a token",
                    k.resolve("")
                )));
            }
            set(w, k, Value::U32(id));
        }
    }
    set(
        w,
        Key::TokenizerAddBos,
        Value::Bool(add_bos && bos.is_some()),
    );
    Ok(n_tokens)
}

/// `<0xXX>`: a SentencePiece byte-fallback piece.
fn is_byte_piece(t: &str) -> bool {
    t.len() == 6
        && t.starts_with("<0x")
        && t.ends_with('>')
        && t[3..5].bytes().all(|b| b.is_ascii_hexdigit())
}

/// SentencePiece scores of `tokens`: minus the rank of the first merge making each piece
/// (higher merges first); pieces no merge makes score below every merged one, in id order.
fn piece_scores(tokens: &[String], merges: &[GgufString]) -> Vec<f32> {
    let index: std::collections::HashMap<&str, usize> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.as_str(), i))
        .collect();
    let mut rank: Vec<Option<usize>> = vec![None; tokens.len()];
    let mut joined = String::new();
    for (r, m) in merges.iter().enumerate() {
        let Some((a, b)) = m.as_str().and_then(|s| s.split_once(' ')) else {
            continue;
        };
        joined.clear();
        joined.push_str(a);
        joined.push_str(b);
        if let Some(&id) = index.get(joined.as_str()) {
            rank[id].get_or_insert(r);
        }
    }
    let n = merges.len();
    rank.iter()
        .enumerate()
        .map(|(id, r)| -(r.unwrap_or(n + id) as f32))
        .collect()
}

/// Whether a SentencePiece `tokenizer.json` puts `▁` in front of the text: a `Prepend`
/// normalizer (Llama 2's converter) or a `Metaspace` pre-tokenizer that prepends (newer
/// conversions); Gemma's (a `Replace` only) does not.
fn adds_space_prefix(json: &Json) -> Result<bool> {
    fn ty(j: &Json) -> &str {
        j.get("type").and_then(Json::as_str).unwrap_or("")
    }
    fn parts<'a>(j: &'a Json, key: &str) -> Vec<&'a Json> {
        match ty(j) {
            "Sequence" => j
                .get(key)
                .and_then(Json::as_array)
                .map(|a| a.iter().collect())
                .unwrap_or_default(),
            "" => Vec::new(),
            _ => vec![j],
        }
    }
    let norm = json.get("normalizer").unwrap_or(&Json::Null);
    let pre = json.get("pre_tokenizer").unwrap_or(&Json::Null);
    let prepend = parts(norm, "normalizers")
        .iter()
        .any(|n| ty(n) == "Prepend" && n.get("prepend").and_then(Json::as_str) == Some("\u{2581}"));
    let metaspace = parts(pre, "pretokenizers")
        .into_iter()
        .find(|p| ty(p) == "Metaspace");
    match metaspace {
        None => Ok(prepend),
        Some(m) => {
            let scheme = m.get("prepend_scheme").and_then(Json::as_str);
            let legacy = m.get("add_prefix_space").and_then(Json::as_bool);
            match (scheme, legacy) {
                (Some("first" | "always"), _) | (None, Some(true)) => Ok(true),
                (Some("never"), _) | (None, Some(false)) => Ok(prepend),
                _ => Err(bad(format!(
                    "a Metaspace pre-tokenizer whose prefix rule is not known: {}",
                    summarize(m)
                ))),
            }
        }
    }
}

/// llama.cpp's name for a byte-level pre-tokenizer (`tokenizer.ggml.pre`), from its structure.
fn pre_name(p: &Json) -> Result<&'static str> {
    fn ty(j: &Json) -> &str {
        j.get("type").and_then(Json::as_str).unwrap_or("")
    }
    let byte_level = |j: &Json| ty(j) == "ByteLevel";
    match ty(p) {
        "ByteLevel" if p.get("use_regex").and_then(Json::as_bool) != Some(false) => {
            return Ok("gpt-2")
        }
        "Sequence" => {
            let parts = p
                .get("pretokenizers")
                .and_then(Json::as_array)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            if let [first, last] = parts {
                if ty(first) == "Digits"
                    && first.get("individual_digits").and_then(Json::as_bool) == Some(true)
                    && byte_level(last)
                {
                    return Ok("smollm");
                }
                let regex = first
                    .get("pattern")
                    .and_then(|p| p.get("Regex"))
                    .and_then(Json::as_str);
                if ty(first) == "Split" && byte_level(last) {
                    match regex {
                        Some(r) if r == LLAMA3_SPLIT => return Ok("llama-bpe"),
                        Some(r) if r == QWEN2_SPLIT => return Ok("qwen2"),
                        _ => {}
                    }
                }
            }
        }
        _ => {}
    }
    Err(bad(format!(
        "its pre-tokenizer is not one llama.cpp names (GPT-2's byte-level, SmolLM's, Llama 3's or \
         Qwen2's are): {}",
        summarize(p)
    )))
}

/// Whether the post-processor puts a special token before a single sequence (a BOS).
fn adds_bos(p: &Json) -> bool {
    let single = |t: &Json| {
        t.get("single")
            .and_then(Json::as_array)
            .and_then(|s| s.first())
            .is_some_and(|first| first.get("SpecialToken").is_some())
    };
    match p.get("type").and_then(Json::as_str) {
        Some("TemplateProcessing") => single(p),
        Some("Sequence") => p
            .get("processors")
            .and_then(Json::as_array)
            .is_some_and(|ps| ps.iter().any(adds_bos)),
        _ => false,
    }
}

/// At most 200 characters of `j`.
fn summarize(j: &Json) -> String {
    let s = j.to_string();
    match s.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vocab_json(pre: Json, post: Json) -> Json {
        json!({
            "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
                      "merges": ["a b"]},
            "added_tokens": [{"id": 3, "content": "<|end|>", "special": true},
                             {"id": 4, "content": "<tool>", "special": false}],
            "pre_tokenizer": pre,
            "post_processor": post,
        })
    }

    fn written(j: &Json, bos: Option<u32>) -> Result<tinynn_format::gguf::Gguf> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("gpt2".into()));
        write_vocab(&mut w, j, bos, Some(3))?;
        let mut bytes = Vec::new();
        w.write_to(&mut bytes).unwrap();
        Ok(tinynn_format::gguf::Gguf::parse(&bytes).unwrap())
    }

    #[test]
    fn a_byte_level_vocabulary_becomes_gguf_keys() {
        let j = vocab_json(
            json!({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true}),
            json!({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|end|>"}},
                                                         {"Sequence": {"id": "A"}}]}),
        );
        let g = written(&j, Some(3)).unwrap();
        assert_eq!(g.get_str(Key::TokenizerModel).unwrap(), Some("gpt2"));
        assert_eq!(g.get_str(Key::TokenizerPre).unwrap(), Some("gpt-2"));
        let Some(Array::String(t)) = g.get_array(Key::TokenizerTokens).unwrap() else {
            panic!("no tokens")
        };
        let t: Vec<String> = t.iter().map(|s| s.to_string()).collect();
        assert_eq!(t, ["a", "b", "ab", "<|end|>", "<tool>"]);
        assert_eq!(
            g.get_array(Key::TokenizerTokenType).unwrap(),
            Some(&Array::I32(vec![1, 1, 1, 3, 4]))
        );
        assert_eq!(g.get_u64(Key::TokenizerEosId).unwrap(), Some(3));
        assert_eq!(g.get_bool(Key::TokenizerAddBos).unwrap(), Some(true));
    }

    #[test]
    fn known_pre_tokenizers_are_named_and_others_refused() {
        let seq = |first: Json| {
            json!({"type": "Sequence", "pretokenizers": [first,
                {"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]})
        };
        let split =
            |r: &str| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated"});
        assert_eq!(
            pre_name(&seq(json!({"type": "Digits", "individual_digits": true}))).unwrap(),
            "smollm"
        );
        assert_eq!(pre_name(&seq(split(LLAMA3_SPLIT))).unwrap(), "llama-bpe");
        assert_eq!(pre_name(&seq(split(QWEN2_SPLIT))).unwrap(), "qwen2");
        let e = pre_name(&seq(split("\\w+"))).unwrap_err().to_string();
        assert!(e.contains("not one llama.cpp names"), "{e}");
        assert!(pre_name(&json!({"type": "Metaspace"})).is_err());
    }

    #[test]
    fn a_sentencepiece_vocabulary_gets_scores_types_and_its_prefix_rule() {
        let spm = |norm: Json, pre: Json| {
            json!({
                "model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>",
                          "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "\u{2581}": 3, "a": 4,
                                    "b": 5, "\u{2581}a": 6, "ab": 7, "\u{2581}ab": 8, "ba": 9},
                          "merges": [["\u{2581}", "a"], "a b", ["\u{2581}a", "b"], ["\u{2581}", "ab"]]},
                "added_tokens": [{"id": 1, "content": "<s>", "special": true}],
                "normalizer": norm,
                "pre_tokenizer": pre,
                "post_processor": {"type": "TemplateProcessing",
                                   "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}]},
            })
        };
        let prepend = json!({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u{2581}"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"}]});
        let g = written(&spm(prepend, Json::Null), Some(1)).unwrap();
        assert_eq!(g.get_str(Key::TokenizerModel).unwrap(), Some("llama"));
        assert_eq!(
            g.get_array(Key::TokenizerTokenType).unwrap(),
            Some(&Array::I32(vec![2, 3, 6, 1, 1, 1, 1, 1, 1, 1]))
        );
        // Merged pieces score minus their first merge's rank; the others below, by id.
        assert_eq!(
            g.get_array(Key::TokenizerScores).unwrap(),
            Some(&Array::F32(vec![
                -4., -5., -6., -7., -8., -9., 0., -1., -2., -13.
            ]))
        );
        assert_eq!(g.get_u64(Key::TokenizerUnknownId).unwrap(), Some(0));
        assert_eq!(g.get_bool(Key::TokenizerAddBos).unwrap(), Some(true));
        let prefix = |g: &tinynn_format::gguf::Gguf| {
            g.get_raw("tokenizer.ggml.add_space_prefix")
                .and_then(|v| v.as_bool())
        };
        assert_eq!(prefix(&g), Some(true));
        // Gemma's: spaces replaced, nothing in front.
        let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": "\u{2581}"});
        assert_eq!(
            prefix(&written(&spm(replace, Json::Null), None).unwrap()),
            Some(false)
        );
        // Newer transformers: a Metaspace pre-tokenizer says it.
        for (scheme, want) in [("first", true), ("always", true), ("never", false)] {
            let pre =
                json!({"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": scheme});
            assert_eq!(
                prefix(&written(&spm(Json::Null, pre), None).unwrap()),
                Some(want)
            );
        }
        let odd = json!({"type": "Metaspace", "prepend_scheme": "sometimes"});
        assert!(written(&spm(Json::Null, odd), None)
            .unwrap_err()
            .to_string()
            .contains("prefix rule"));
        let mut j = spm(Json::Null, Json::Null);
        j["model"]["unk_token"] = json!("<nope>");
        assert!(written(&j, None)
            .unwrap_err()
            .to_string()
            .contains("<nope>"));
    }

    #[test]
    fn bad_vocabularies_are_refused() {
        let mut j = vocab_json(json!({"type": "ByteLevel"}), Json::Null);
        j["model"]["vocab"]["c"] = json!(9);
        assert!(written(&j, None)
            .unwrap_err()
            .to_string()
            .contains("token id 9"));
        let mut j = vocab_json(json!({"type": "ByteLevel"}), Json::Null);
        j["added_tokens"][1]["id"] = json!(1);
        assert!(written(&j, None)
            .unwrap_err()
            .to_string()
            .contains("names both"));
        let j = vocab_json(json!({"type": "ByteLevel"}), Json::Null);
        assert!(written(&j, Some(77))
            .unwrap_err()
            .to_string()
            .contains("77"));
    }
}
