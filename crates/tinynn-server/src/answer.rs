//! The OpenAI response shapes of a generation: the whole JSON answer, or server-sent events
//! (a chunk per piece of text, a last chunk per choice, the usage chunk, `[DONE]`), built from
//! the engine's events.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use tinynn_models::generate::Finish;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_stream::wrappers::ReceiverStream;

use crate::engine::{Event, GenParams, TokenLogprob};
use crate::error::ApiError;

/// Which endpoint a generation answers.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Kind {
    Chat,
    Completion,
}

/// A checked generation request: prompts (one per prompt × `n` choice) and how to answer.
pub(crate) struct Job {
    pub kind: Kind,
    /// Per choice: its prompt's index and its settings.
    pub choices: Vec<(usize, GenParams)>,
    pub prompts: Vec<Vec<u32>>,
    /// Text put before each choice's text (`echo`).
    pub echo: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: Option<usize>,
}

pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What every response of one request carries: its id, time and model.
pub(crate) struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub model_ref: Arc<tinynn_models::model::Model>,
}

impl Meta {
    fn token_text(&self, t: u32) -> (String, Vec<u8>) {
        let bytes = self
            .model_ref
            .vocab()
            .map(|v| v.token_bytes(t))
            .unwrap_or_default();
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// A completion's `top_logprobs` entry: `{token text: logprob}` of the alternatives.
    fn completion_top(&self, lp: &TokenLogprob) -> Value {
        Value::Object(
            lp.top
                .iter()
                .map(|&(t, l)| (self.token_text(t).0, json!(l)))
                .collect(),
        )
    }

    /// A chat `logprobs.content` entry.
    fn chat_logprob(&self, lp: &TokenLogprob) -> Value {
        let entry = |t: u32, l: f32| {
            let (text, bytes) = self.token_text(t);
            json!({"token": text, "logprob": l, "bytes": bytes})
        };
        let mut e = entry(lp.token, lp.logprob);
        e["top_logprobs"] = Value::Array(lp.top.iter().map(|&(t, l)| entry(t, l)).collect());
        e
    }
}

fn finish_name(f: Finish) -> &'static str {
    match f {
        Finish::Length => "length",
        Finish::EndToken | Finish::Stop => "stop",
    }
}

/// One choice's text and log-probabilities, gathered for a whole answer.
#[derive(Default)]
struct Gathered {
    text: String,
    finish: Option<Finish>,
    /// Chat: `logprobs.content`; completions: tokens, their logprobs, tops, offsets.
    chat_lp: Vec<Value>,
    tokens: Vec<String>,
    token_lp: Vec<f32>,
    top_lp: Vec<Value>,
    offsets: Vec<usize>,
}

fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    })
}

pub(crate) async fn whole(
    meta: Meta,
    job: Job,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Result<Response, ApiError> {
    let mut out: Vec<Gathered> = job
        .choices
        .iter()
        .map(|(p, _)| Gathered {
            text: job.echo[*p].clone(),
            ..Gathered::default()
        })
        .collect();
    let mut left = out.len();
    let mut completion_tokens = 0;
    while left > 0 {
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the engine stopped"));
        };
        let g = &mut out[i];
        match ev {
            Event::Piece { text, logprob, .. } => {
                if let Some(lp) = &logprob {
                    if job.kind == Kind::Chat {
                        g.chat_lp.push(meta.chat_logprob(lp));
                    } else {
                        g.offsets.push(g.text.len());
                        g.tokens.push(meta.token_text(lp.token).0);
                        g.token_lp.push(lp.logprob);
                        g.top_lp.push(meta.completion_top(lp));
                    }
                }
                g.text.push_str(&text);
            }
            Event::Done {
                finish,
                completion_tokens: c,
                ..
            } => {
                g.finish = Some(finish);
                completion_tokens += c;
                left -= 1;
            }
            Event::Error(e) => return Err(ApiError::internal(e)),
        }
    }
    let prompt_tokens: usize = job.prompts.iter().map(Vec::len).sum();
    let choices: Vec<Value> = out
        .into_iter()
        .enumerate()
        .map(|(i, g)| {
            let finish = g.finish.map(finish_name);
            match job.kind {
                Kind::Chat => json!({
                    "index": i,
                    "message": {"role": "assistant", "content": g.text},
                    "logprobs": job.logprobs.map(|_| json!({"content": g.chat_lp})),
                    "finish_reason": finish,
                }),
                Kind::Completion => json!({
                    "index": i,
                    "text": g.text,
                    "logprobs": job.logprobs.map(|_| json!({
                        "tokens": g.tokens,
                        "token_logprobs": g.token_lp,
                        "top_logprobs": g.top_lp,
                        "text_offset": g.offsets,
                    })),
                    "finish_reason": finish,
                }),
            }
        })
        .collect();
    Ok(Json(json!({
        "id": meta.id,
        "object": if job.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": choices,
        "usage": usage(prompt_tokens, completion_tokens),
    }))
    .into_response())
}

/// The answer as server-sent events: a chunk per piece of text, a last chunk per choice with
/// its finish reason, the usage chunk when asked for, then `data: [DONE]`.
pub(crate) fn stream(
    meta: Meta,
    job: Job,
    mut rx: UnboundedReceiver<(usize, Event)>,
) -> Sse<ReceiverStream<Result<SseEvent, Infallible>>> {
    let (tx, out) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let object = if job.kind == Kind::Chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        let chunk = |choice: Value| {
            let mut c = json!({
                "id": meta.id,
                "object": object,
                "created": meta.created,
                "model": meta.model,
                "choices": [choice],
            });
            if job.include_usage {
                c["usage"] = Value::Null;
            }
            SseEvent::default().data(c.to_string())
        };
        let mut first = vec![true; job.choices.len()];
        let mut text_len = vec![0usize; job.choices.len()];
        let mut left = job.choices.len();
        let mut completion_tokens = 0;
        while left > 0 {
            // Stop (and so cancel the engine's work) as soon as the client is gone.
            let ev = tokio::select! {
                ev = rx.recv() => ev,
                _ = tx.closed() => return,
            };
            let Some((i, ev)) = ev else {
                let _ = tx
                    .send(Ok(SseEvent::default().data(
                        ApiError::internal("the engine stopped").body().to_string(),
                    )))
                    .await;
                return;
            };
            let mut events = Vec::new();
            match ev {
                Event::Piece { text, logprob, .. } => {
                    let mut text = text;
                    if first[i] && job.kind == Kind::Completion {
                        text.insert_str(0, &job.echo[job.choices[i].0]);
                    }
                    let lp = logprob.as_ref().map(|lp| match job.kind {
                        Kind::Chat => json!({"content": [meta.chat_logprob(lp)]}),
                        Kind::Completion => json!({
                            "tokens": [meta.token_text(lp.token).0],
                            "token_logprobs": [lp.logprob],
                            "top_logprobs": [meta.completion_top(lp)],
                            "text_offset": [text_len[i]],
                        }),
                    });
                    text_len[i] += text.len();
                    events.push(match job.kind {
                        Kind::Chat => {
                            let delta = if first[i] {
                                json!({"role": "assistant", "content": text})
                            } else {
                                json!({"content": text})
                            };
                            chunk(json!({"index": i, "delta": delta, "logprobs": lp, "finish_reason": null}))
                        }
                        Kind::Completion => chunk(
                            json!({"index": i, "text": text, "logprobs": lp, "finish_reason": null}),
                        ),
                    });
                    first[i] = false;
                }
                Event::Done {
                    finish,
                    completion_tokens: c,
                    ..
                } => {
                    completion_tokens += c;
                    left -= 1;
                    let name = finish_name(finish);
                    events.push(match job.kind {
                        Kind::Chat => {
                            let delta = if first[i] {
                                json!({"role": "assistant", "content": ""})
                            } else {
                                json!({})
                            };
                            chunk(json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": name}))
                        }
                        Kind::Completion => chunk(json!({
                            "index": i,
                            "text": if first[i] { job.echo[job.choices[i].0].clone() } else { String::new() },
                            "logprobs": null,
                            "finish_reason": name,
                        })),
                    });
                    first[i] = false;
                }
                Event::Error(e) => {
                    let _ = tx
                        .send(Ok(
                            SseEvent::default().data(ApiError::internal(e).body().to_string())
                        ))
                        .await;
                    return;
                }
            }
            for e in events {
                if tx.send(Ok(e)).await.is_err() {
                    return;
                }
            }
        }
        if job.include_usage {
            let prompt_tokens: usize = job.prompts.iter().map(Vec::len).sum();
            let u = json!({
                "id": meta.id,
                "object": object,
                "created": meta.created,
                "model": meta.model,
                "choices": [],
                "usage": usage(prompt_tokens, completion_tokens),
            });
            let _ = tx.send(Ok(SseEvent::default().data(u.to_string()))).await;
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(out))
}
