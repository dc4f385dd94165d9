//! A `tokenizer.json` byte-level BPE vocabulary as llama.cpp's GGUF tokenizer keys
//! (`tokenizer.ggml.model = gpt2`): the tokens by id, their types, the merges, the
//! pre-tokenizer name llama.cpp knows it by, and whether a BOS is added.
//!
//! SentencePiece-style vocabularies (`byte_fallback`, `▁` for spaces: Llama 2, Mistral, Gemma)
//! and pre-tokenizers llama.cpp has no name for are refused rather than written wrong.

use serde_json::Value as Json;
use tinynn_format::gguf::{Array, GgufString, GgufWriter, Key, Value};

use crate::tokenizer::{LLAMA3_SPLIT, QWEN2_SPLIT};
use crate::{ModelError, Result};

/// `tokenizer.ggml.token_type` values.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

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
    if model.get("byte_fallback").and_then(Json::as_bool) == Some(true) {
        return Err(bad(
            "a SentencePiece-style vocabulary (byte_fallback) is not converted yet (byte-level BPE is); \
             convert without the tokenizer or use a GGUF file",
        ));
    }
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
    let pre = pre_name(json.get("pre_tokenizer").unwrap_or(&Json::Null))?;
    let add_bos = adds_bos(json.get("post_processor").unwrap_or(&Json::Null));

    let n_tokens = tokens.len();
    let tokens: Vec<GgufString> = tokens
        .into_iter()
        .map(|t| GgufString::from(t.unwrap_or_default()))
        .collect();
    let set = |w: &mut GgufWriter<'_>, k: Key, v: Value| {
        w.set(&k.resolve(""), v);
    };
    set(w, Key::TokenizerModel, Value::String("gpt2".into()));
    set(w, Key::TokenizerPre, Value::String(pre.into()));
    set(w, Key::TokenizerTokens, Value::Array(Array::String(tokens)));
    set(w, Key::TokenizerTokenType, Value::Array(Array::I32(types)));
    set(w, Key::TokenizerMerges, Value::Array(Array::String(merges)));
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
    fn bad_vocabularies_are_refused() {
        let mut j = vocab_json(json!({"type": "ByteLevel"}), Json::Null);
        j["model"]["byte_fallback"] = json!(true);
        assert!(written(&j, None)
            .unwrap_err()
            .to_string()
            .contains("SentencePiece"));
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
