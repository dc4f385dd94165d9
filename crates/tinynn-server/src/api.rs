//! The OpenAI request bodies and their checks: each field parsed, each value checked, and a
//! 400 naming the field for anything out of range.

// The request fields are the OpenAI API's, named and documented as there.
#![allow(missing_docs)]

use std::collections::HashMap;

use serde::Deserialize;
use tinynn_models::chat::Message;
use tinynn_models::sampling::{Penalties, Strategy};

use crate::engine::GenParams;
use crate::error::ApiError;

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;
/// Most stop strings.
const MAX_STOPS: usize = 16;
/// Most `top_logprobs`.
const MAX_TOP_LOGPROBS: usize = 20;

/// Either one string or a list of them (`stop`).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// The sampling fields shared by both completion endpoints.
#[derive(Deserialize, Debug, Default)]
pub struct SamplingFields {
    pub model: Option<String>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub n: Option<usize>,
    pub max_tokens: Option<usize>,
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Option<OneOrMany>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub logit_bias: Option<HashMap<String, f32>>,
    /// llama-server's extension: never end at an end-of-text token.
    #[serde(default)]
    pub ignore_eos: bool,
}

/// `stream_options`.
#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// One content part of a chat message (`{"type": "text", "text": ...}`).
#[derive(Deserialize, Debug)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One chat message.
#[derive(Deserialize, Debug)]
pub struct ChatMessage {
    pub role: String,
    pub content: Option<Content>,
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// A completion prompt: text, or token ids.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions`.
#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// Log-probabilities of the chosen token and this many alternatives.
    pub logprobs: Option<usize>,
    #[serde(default)]
    pub echo: bool,
    #[serde(flatten)]
    pub sampling: SamplingFields,
}

/// `input` of an embedding request: a text, texts, token ids, or lists of token ids.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum EmbeddingInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`.
#[derive(Deserialize, Debug)]
pub struct EmbeddingRequest {
    pub input: EmbeddingInput,
    pub model: Option<String>,
    pub encoding_format: Option<String>,
}

/// Most inputs of one embedding request.
pub const MAX_EMBEDDING_INPUTS: usize = 256;

/// The token ids of each input of an embedding request (texts through `encode`), checked:
/// 1 to 256 inputs, every id in the vocabulary.
pub fn embedding_inputs(
    input: &EmbeddingInput,
    encode: impl Fn(&str) -> Result<Vec<u32>, ApiError>,
    vocab: usize,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let inputs = match input {
        EmbeddingInput::Text(t) => vec![encode(t)?],
        EmbeddingInput::Texts(v) => v.iter().map(|t| encode(t)).collect::<Result<_, _>>()?,
        EmbeddingInput::Tokens(ids) => vec![ids.clone()],
        EmbeddingInput::TokenLists(v) => v.clone(),
    };
    range(
        (1..=MAX_EMBEDDING_INPUTS).contains(&inputs.len()),
        "input",
        "1 to 256 inputs",
    )?;
    if let Some(bad) = inputs.iter().flatten().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(
            format!("input token {bad} is not in the vocabulary (0..{vocab})"),
            Some("input"),
        ));
    }
    Ok(inputs)
}

/// `POST /tokenize` (llama-server's shape).
#[derive(Deserialize, Debug)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub add_special: bool,
}

/// `POST /detokenize`.
#[derive(Deserialize, Debug)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

/// Parses a JSON body into `T`, or a 400 that says what is wrong and where.
pub fn parse<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))
}

/// The messages of a chat request as the template takes them.
pub fn messages(req: &ChatRequest) -> Result<Vec<Message>, ApiError> {
    if req.messages.is_empty() {
        return Err(ApiError::bad_request(
            "`messages` must hold at least one message",
            Some("messages"),
        ));
    }
    req.messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(
                                    format!("messages[{i}]: content part of type '{kind}' is not supported (only text)"),
                                    Some("messages"),
                                ))
                            }
                        }
                    }
                    text
                }
            };
            Ok(Message::new(&m.role, &content))
        })
        .collect()
}

fn range(ok: bool, param: &str, what: &str) -> Result<(), ApiError> {
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            format!("`{param}` must be {what}"),
            Some(param),
        ))
    }
}

/// The generation settings of choice `index` of a request, checked. Unset fields take
/// llama-server's defaults (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05); temperature 0
/// is greedy. `max_tokens` defaults to the rest of the slot's context.
pub fn gen_params(
    s: &SamplingFields,
    logprobs: Option<usize>,
    vocab: usize,
    index: usize,
) -> Result<GenParams, ApiError> {
    let temperature = s.temperature.unwrap_or(0.8);
    range(
        temperature.is_finite() && (0.0..=100.0).contains(&temperature),
        "temperature",
        "between 0 and 100",
    )?;
    let top_p = s.top_p.unwrap_or(0.95);
    range(
        top_p > 0.0 && top_p <= 1.0,
        "top_p",
        "greater than 0 and at most 1",
    )?;
    let min_p = s.min_p.unwrap_or(0.05);
    range((0.0..=1.0).contains(&min_p), "min_p", "between 0 and 1")?;
    let top_k = s.top_k.unwrap_or(40);
    for (name, v) in [
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ] {
        if let Some(v) = v {
            range(
                v.is_finite() && (-2.0..=2.0).contains(&v),
                name,
                "between -2 and 2",
            )?;
        }
    }
    if let Some(r) = s.repeat_penalty {
        range(
            r.is_finite() && r > 0.0 && r <= 10.0,
            "repeat_penalty",
            "greater than 0 and at most 10",
        )?;
    }
    let max_tokens = s.max_completion_tokens.or(s.max_tokens);
    if let Some(m) = max_tokens {
        range(m >= 1, "max_tokens", "at least 1")?;
    }
    let stop = match &s.stop {
        None => Vec::new(),
        Some(OneOrMany::One(t)) => vec![t.clone()],
        Some(OneOrMany::Many(v)) => v.clone(),
    };
    range(stop.len() <= MAX_STOPS, "stop", "at most 16 strings")?;
    let stop = stop.into_iter().filter(|t| !t.is_empty()).collect();
    if let Some(k) = logprobs {
        range(k <= MAX_TOP_LOGPROBS, "top_logprobs", "between 0 and 20")?;
    }
    let mut logit_bias = Vec::new();
    for (k, &v) in s.logit_bias.iter().flatten() {
        let id: u32 = k
            .parse()
            .ok()
            .filter(|&id: &u32| (id as usize) < vocab)
            .ok_or_else(|| {
                ApiError::bad_request(
                    format!("logit_bias: '{k}' is not a token id of this model (0..{vocab})"),
                    Some("logit_bias"),
                )
            })?;
        range(
            v.is_finite() && (-100.0..=100.0).contains(&v),
            "logit_bias",
            "values between -100 and 100",
        )?;
        logit_bias.push((id, if v <= -100.0 { f32::NEG_INFINITY } else { v }));
    }
    let strategy = if temperature == 0.0 {
        Strategy::Greedy
    } else {
        let seed = match s.seed {
            Some(seed) => seed.wrapping_add(index as u64),
            None => random_seed(index),
        };
        Strategy::Sample {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
        }
    };
    Ok(GenParams {
        max_tokens: max_tokens.unwrap_or(usize::MAX),
        strategy,
        penalties: Penalties {
            repeat: s.repeat_penalty.unwrap_or(1.0),
            presence: s.presence_penalty.unwrap_or(0.0),
            frequency: s.frequency_penalty.unwrap_or(0.0),
            ..Penalties::default()
        },
        stop,
        logprobs,
        logit_bias,
        ignore_eos: s.ignore_eos,
    })
}

/// Choices a request asks for (`n`), checked.
pub fn choices(s: &SamplingFields) -> Result<usize, ApiError> {
    let n = s.n.unwrap_or(1);
    range((1..=MAX_CHOICES).contains(&n), "n", "between 1 and 16")?;
    Ok(n)
}

/// A seed for a request that gave none: the clock, mixed with the choice index.
fn random_seed(index: usize) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(json: &str) -> SamplingFields {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn defaults_are_llama_servers_and_temperature_zero_is_greedy() {
        let p = gen_params(&fields("{}"), None, 100, 0).unwrap();
        match p.strategy {
            Strategy::Sample {
                temperature,
                top_k,
                top_p,
                min_p,
                ..
            } => assert_eq!((temperature, top_k, top_p, min_p), (0.8, 40, 0.95, 0.05)),
            s => panic!("{s:?}"),
        }
        let p = gen_params(&fields(r#"{"temperature": 0}"#), None, 100, 0).unwrap();
        assert_eq!(p.strategy, Strategy::Greedy);
    }

    #[test]
    fn a_seed_makes_choices_distinct_and_reproducible() {
        let f = fields(r#"{"seed": 5}"#);
        let seed = |i| match gen_params(&f, None, 100, i).unwrap().strategy {
            Strategy::Sample { seed, .. } => seed,
            _ => unreachable!(),
        };
        assert_eq!(seed(0), 5);
        assert_eq!(seed(1), 6);
        assert_eq!(seed(0), seed(0));
    }

    #[test]
    fn out_of_range_values_name_their_field() {
        for (json, param) in [
            (r#"{"temperature": -1}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"min_p": 2}"#, "min_p"),
            (r#"{"presence_penalty": 3}"#, "presence_penalty"),
            (r#"{"frequency_penalty": -2.5}"#, "frequency_penalty"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"logit_bias": {"100": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"x": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"3": 101}}"#, "logit_bias"),
            (r#"{"repeat_penalty": 0}"#, "repeat_penalty"),
        ] {
            let e = gen_params(&fields(json), None, 100, 0).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
            assert_eq!(e.status, 400);
        }
        assert_eq!(
            gen_params(&fields("{}"), Some(21), 100, 0)
                .unwrap_err()
                .param
                .as_deref(),
            Some("top_logprobs")
        );
        assert!(choices(&fields(r#"{"n": 0}"#)).is_err());
        assert!(choices(&fields(r#"{"n": 17}"#)).is_err());
        assert_eq!(choices(&fields(r#"{"n": 3}"#)).unwrap(), 3);
    }

    #[test]
    fn logit_bias_of_minus_100_bans_the_token() {
        let p = gen_params(
            &fields(r#"{"logit_bias": {"7": -100, "8": 2.5}}"#),
            None,
            100,
            0,
        )
        .unwrap();
        let mut b = p.logit_bias.clone();
        b.sort_by_key(|x| x.0);
        assert_eq!(b, vec![(7, f32::NEG_INFINITY), (8, 2.5)]);
    }

    #[test]
    fn message_content_may_be_text_parts() {
        let req: ChatRequest = serde_json::from_str(
            r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(messages(&req).unwrap(), vec![Message::new("user", "ab")]);
        let req: ChatRequest = serde_json::from_str(
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
        )
        .unwrap();
        assert!(messages(&req).is_err());
        let req: ChatRequest = serde_json::from_str(r#"{"messages": []}"#).unwrap();
        assert!(messages(&req).is_err());
    }
}
