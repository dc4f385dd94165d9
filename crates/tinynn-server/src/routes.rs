//! The HTTP routes: request checks, submission to the engine, and the OpenAI response shapes
//! (whole JSON or server-sent events).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

use crate::answer::{stream, unix_now, whole, Job, Kind, Meta};
use crate::api::{self, CompletionRequest, Prompt, SamplingFields};
use crate::engine::{EmbedRequest, Event, Refused, Request as EngineRequest, Work};
use crate::error::ApiError;
use crate::{AppState, Ready};

type Shared = Arc<AppState>;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(embeddings))
        .route("/", get(chat_page))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(|req: Request| async move { ApiError::not_found(req.uri().path()) })
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// API key and CORS around every route (`/`, `/health` and `/metrics` need no key: the page
/// asks for the key itself).
async fn guard(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let cors = state.config.cors.clone();
    let path = req.uri().path().to_owned();
    let mut resp = if req.method() == Method::OPTIONS && cors.is_some() {
        StatusCode::NO_CONTENT.into_response()
    } else if !authorized(&state, req.headers(), &path) {
        ApiError::unauthorized().into_response()
    } else {
        if path != "/health" && path != "/metrics" {
            state.metrics.requests.fetch_add(1, Ordering::Relaxed);
        }
        next.run(req).await
    };
    if let Some(origin) = cors.and_then(|o| HeaderValue::from_str(&o).ok()) {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
    }
    resp
}

fn authorized(state: &AppState, headers: &HeaderMap, path: &str) -> bool {
    let Some(key) = &state.config.api_key else {
        return true;
    };
    if matches!(path, "/" | "/health" | "/metrics") {
        return true;
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The loaded model, or 503 while it loads (500 when it failed to).
fn ready(state: &AppState) -> Result<&Ready, ApiError> {
    match state.ready.get() {
        None => Err(ApiError::loading()),
        Some(Ok(r)) => Ok(r),
        Some(Err(e)) => Err(ApiError::internal(format!("the model failed to load: {e}"))),
    }
}

/// The chat page: one self-contained HTML file (no build step), built into the binary.
const CHAT_PAGE: &str = include_str!("chat.html");

async fn chat_page() -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        CHAT_PAGE,
    )
        .into_response()
}

async fn health(State(state): State<Shared>) -> Response {
    match ready(&state) {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics(State(state): State<Shared>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

async fn models(State(state): State<Shared>) -> Result<Json<Value>, ApiError> {
    let r = ready(&state)?;
    let c = r.model.config();
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": r.model_id,
            "object": "model",
            "created": r.created,
            "owned_by": "tinynn",
            "meta": {
                "n_ctx_train": c.n_ctx_train,
                "n_vocab": r.n_vocab,
                "n_embd": c.n_embd,
                "n_ctx_slot": r.engine.slot_ctx,
            },
        }],
    })))
}

async fn embeddings(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let r = ready(&state)?;
    let req: api::EmbeddingRequest = api::parse(&body)?;
    check_model(
        r,
        &SamplingFields {
            model: req.model.clone(),
            ..SamplingFields::default()
        },
    )?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                format!("`encoding_format` must be 'float' or 'base64', not '{other}'"),
                Some("encoding_format"),
            ))
        }
    };
    let tok = r
        .model
        .tokenizer()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let inputs = api::embedding_inputs(
        &req.input,
        |t| {
            tok.encode(t, true)
                .map_err(|e| ApiError::internal(e.to_string()))
        },
        r.n_vocab,
    )?;
    for (i, input) in inputs.iter().enumerate() {
        if input.is_empty() || input.len() > r.engine.slot_ctx {
            return Err(ApiError::bad_request(
                format!(
                    "input {i} is {} tokens; it must be between 1 and the context of {} tokens per slot",
                    input.len(),
                    r.engine.slot_ctx
                ),
                Some("input"),
            ));
        }
    }
    let prompt_tokens: usize = inputs.iter().map(Vec::len).sum();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let work = Work::Embed(EmbedRequest {
        inputs,
        pooling: state.config.pooling,
        reply: tx,
    });
    if let Err(e) = r.engine.submit(work) {
        if e == Refused::QueueFull {
            state
                .metrics
                .requests_rejected
                .fetch_add(1, Ordering::Relaxed);
        }
        return Err(refused(e));
    }
    let vectors = rx
        .await
        .map_err(|_| ApiError::internal("the engine stopped"))?
        .map_err(ApiError::internal)?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(B64.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": r.model_id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })))
}

async fn tokenize(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let r = ready(&state)?;
    let req: api::TokenizeRequest = api::parse(&body)?;
    let tok = r
        .model
        .tokenizer()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let ids = tok
        .encode(&req.content, req.add_special)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("content")))?;
    Ok(Json(json!({ "tokens": ids })))
}

async fn detokenize(State(state): State<Shared>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let r = ready(&state)?;
    let req: api::DetokenizeRequest = api::parse(&body)?;
    let vocab = r.n_vocab;
    if let Some(bad) = req.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(
            format!("token {bad} is not in the vocabulary (0..{vocab})"),
            Some("tokens"),
        ));
    }
    let tok = r
        .model
        .tokenizer()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let text = tok
        .decode(&req.tokens)
        .map_err(|e| ApiError::bad_request(e.to_string(), Some("tokens")))?;
    Ok(Json(json!({ "content": text })))
}

fn check_model(r: &Ready, s: &SamplingFields) -> Result<(), ApiError> {
    match &s.model {
        Some(m) if !m.is_empty() && *m != r.model_id && !r.model_id.starts_with(m.as_str()) => {
            Err(ApiError::bad_request(
                format!(
                    "model '{m}' is not served here (this server serves '{}')",
                    r.model_id
                ),
                Some("model"),
            ))
        }
        _ => Ok(()),
    }
}

/// The prompt fits a slot; `param` names the request field it came from.
fn check_prompt(r: &Ready, prompt: &[u32], param: &'static str) -> Result<(), ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty", Some(param)));
    }
    if prompt.len() >= r.engine.slot_ctx {
        return Err(ApiError::bad_request(
            format!(
                "the prompt is {} tokens, which does not fit the context of {} tokens per slot",
                prompt.len(),
                r.engine.slot_ctx
            ),
            Some(param),
        ));
    }
    Ok(())
}

fn job(
    r: &Ready,
    kind: Kind,
    prompts: Vec<Vec<u32>>,
    echo: Vec<String>,
    s: &SamplingFields,
    logprobs: Option<usize>,
) -> Result<Job, ApiError> {
    check_model(r, s)?;
    let param = match kind {
        Kind::Chat => "messages",
        Kind::Completion => "prompt",
    };
    for p in &prompts {
        check_prompt(r, p, param)?;
    }
    let n = api::choices(s)?;
    let vocab = r.n_vocab;
    let mut choices = Vec::new();
    for p in 0..prompts.len() {
        for j in 0..n {
            choices.push((p, api::gen_params(s, logprobs, vocab, p * n + j)?));
        }
    }
    Ok(Job {
        kind,
        choices,
        prompts,
        echo,
        stream: s.stream,
        include_usage: s.stream_options.as_ref().is_some_and(|o| o.include_usage),
        logprobs,
    })
}

async fn chat_completions(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let r = ready(&state)?;
    let req: api::ChatRequest = api::parse(&body)?;
    let messages = api::messages(&req)?;
    let template = r.template.as_ref().ok_or_else(|| {
        ApiError::bad_request(
            "the model has no chat template: use /v1/completions, or start the server with --chat-template",
            None,
        )
    })?;
    let text = template.render(&messages, true).map_err(|e| {
        ApiError::bad_request(
            format!("rendering the chat template: {e}"),
            Some("messages"),
        )
    })?;
    let tok = r
        .model
        .tokenizer()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let prompt = tok
        .encode(&text, true)
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let logprobs = req.logprobs.then(|| req.top_logprobs.unwrap_or(0));
    if req.top_logprobs.is_some() && !req.logprobs {
        return Err(ApiError::bad_request(
            "`top_logprobs` needs `logprobs: true`",
            Some("top_logprobs"),
        ));
    }
    let job = job(
        r,
        Kind::Chat,
        vec![prompt],
        vec![String::new()],
        &req.sampling,
        logprobs,
    )?;
    run(state.clone(), job).await
}

async fn completions(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let r = ready(&state)?;
    let req: CompletionRequest = api::parse(&body)?;
    let tok = r
        .model
        .tokenizer()
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let vocab = r.n_vocab;
    let texts: Vec<String> = match &req.prompt {
        Prompt::Text(t) => vec![t.clone()],
        Prompt::Texts(v) if v.is_empty() || v.len() > api::MAX_CHOICES => {
            return Err(ApiError::bad_request(
                "`prompt` must hold between 1 and 16 strings",
                Some("prompt"),
            ))
        }
        Prompt::Texts(v) => v.clone(),
        Prompt::Tokens(ids) => {
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::bad_request(
                    format!("prompt token {bad} is not in the vocabulary (0..{vocab})"),
                    Some("prompt"),
                ));
            }
            let text = tok
                .decode(ids)
                .map_err(|e| ApiError::bad_request(e.to_string(), Some("prompt")))?;
            let job = job(
                r,
                Kind::Completion,
                vec![ids.clone()],
                vec![if req.echo { text } else { String::new() }],
                &req.sampling,
                req.logprobs,
            )?;
            return run(state.clone(), job).await;
        }
    };
    let mut prompts = Vec::new();
    for t in &texts {
        prompts.push(
            tok.encode(t, true)
                .map_err(|e| ApiError::internal(e.to_string()))?,
        );
    }
    let echo = texts
        .into_iter()
        .map(|t| if req.echo { t } else { String::new() })
        .collect();
    let job = job(
        r,
        Kind::Completion,
        prompts,
        echo,
        &req.sampling,
        req.logprobs,
    )?;
    run(state.clone(), job).await
}

/// The answer to a refused submission: 429 for a full queue, 500 for a stopped engine.
fn refused(e: Refused) -> ApiError {
    match e {
        Refused::QueueFull => ApiError::queue_full(),
        Refused::Stopped => ApiError::internal("the engine stopped"),
    }
}

/// Submits every choice of `job` together; 429 (and nothing queued) when the queue cannot
/// take them all.
fn submit(r: &Ready, job: &Job) -> Result<UnboundedReceiver<(usize, Event)>, ApiError> {
    let (tx, rx) = unbounded_channel();
    let received = Instant::now();
    let works = job
        .choices
        .iter()
        .enumerate()
        .map(|(i, (p, params))| {
            Work::Generate(EngineRequest {
                prompt: job.prompts[*p].clone(),
                params: params.clone(),
                index: i,
                events: tx.clone(),
                received,
            })
        })
        .collect();
    r.engine.submit_all(works).map_err(refused)?;
    Ok(rx)
}

async fn run(state: Shared, job: Job) -> Result<Response, ApiError> {
    let r = ready(&state)?;
    let rx = submit(r, &job).inspect_err(|e| {
        if e.status == StatusCode::TOO_MANY_REQUESTS {
            state
                .metrics
                .requests_rejected
                .fetch_add(1, Ordering::Relaxed);
        }
    })?;
    let id = format!(
        "{}-{:x}",
        if job.kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    let meta = Meta {
        id,
        created: r.created.max(unix_now()),
        model: r.model_id.clone(),
        model_ref: r.model.clone(),
    };
    if job.stream {
        Ok(stream(meta, job, rx).into_response())
    } else {
        whole(meta, job, rx).await
    }
}
