//! # tinynn-server
//!
//! An OpenAI-compatible HTTP server over the tinynn engine. The engine runs on its own thread
//! (see [`engine`]): its session holds one KV-cache sequence per slot and every step decodes a
//! token for each busy slot in one plan run, admitting new prompts between steps (continuous
//! batching). HTTP (axum on tokio) never blocks it: requests and their tokens travel over
//! channels.
//!
//! Routes: `GET /` (a chat page), `POST /v1/chat/completions`, `POST /v1/completions` (streaming SSE or not),
//! `POST /v1/embeddings`, `GET /v1/models`, `GET /health` (503 while the model loads), `GET /metrics` (Prometheus),
//! `POST /tokenize`, `POST /detokenize`.
//!
//! ```no_run
//! let server = tinynn_server::spawn(tinynn_server::ServerConfig {
//!     model: "SmolLM2-135M-Instruct.Q4_1.gguf".into(),
//!     ..tinynn_server::ServerConfig::default()
//! })?;
//! println!("listening on http://{}", server.addr());
//! server.wait_ready()?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![warn(missing_docs)]

mod answer;
pub mod api;
pub mod engine;
pub mod error;
pub mod metrics;
mod routes;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tinynn_cpu::ExecOptions;
use tinynn_models::chat::ChatTemplate;
use tinynn_models::embed::Pooling;
use tinynn_models::lora::AppliedLora;
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};

use crate::engine::EngineHandle;
use crate::metrics::Metrics;

/// How long in-flight requests may run on after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(10);

/// How the server is set up (`tnn serve`'s flags).
#[derive(Clone)]
pub struct ServerConfig {
    /// The model file or Hugging Face directory.
    pub model: PathBuf,
    /// Address to bind (default 127.0.0.1: this machine only).
    pub host: String,
    /// Port (0 picks a free one).
    pub port: u16,
    /// KV cache tokens in all; each slot gets `n_ctx / slots`.
    pub n_ctx: usize,
    /// Requests generating at once.
    pub slots: usize,
    /// Requests that may wait for a slot (more get 429).
    pub queue: usize,
    /// Most tokens per plan run.
    pub n_batch: usize,
    /// Threads, strict mode, repacking.
    pub exec: ExecOptions,
    /// Clients must send `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Browsers from this origin may call the API (CORS).
    pub cors: Option<String>,
    /// LoRA adapters applied to every request (their branches add up).
    pub lora: Vec<AppliedLora>,
    /// A chat template (Jinja source) to use instead of the model's.
    pub chat_template: Option<String>,
    /// How `/v1/embeddings` pools a text's hidden states.
    pub pooling: Pooling,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            model: PathBuf::new(),
            host: "127.0.0.1".into(),
            port: 8080,
            n_ctx: 4096,
            slots: 4,
            queue: 64,
            n_batch: 512,
            exec: ExecOptions::default(),
            api_key: None,
            cors: None,
            lora: Vec::new(),
            chat_template: None,
            pooling: Pooling::Mean,
        }
    }
}

/// What the routes share.
pub(crate) struct AppState {
    pub config: ServerConfig,
    pub metrics: Arc<Metrics>,
    /// Set once the model is loaded (or failed to load).
    pub ready: OnceLock<Result<Ready, String>>,
}

/// The loaded model and its engine.
pub(crate) struct Ready {
    pub model: Arc<Model>,
    pub template: Option<ChatTemplate>,
    pub engine: EngineHandle,
    /// The name clients use for the model (`/v1/models`).
    pub model_id: String,
    /// When it was loaded (seconds since the epoch).
    pub created: u64,
    /// Tokens of the vocabulary (the logits' length).
    pub n_vocab: usize,
}

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding or serving failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The model could not be loaded.
    #[error("loading the model: {0}")]
    Load(String),
}

/// Loads the model and starts the engine (blocking: the model file is read and the weights
/// packed).
fn load(config: &ServerConfig, metrics: Arc<Metrics>) -> Result<Ready, String> {
    let model = Model::open(&config.model).map_err(|e| e.to_string())?;
    let template = match (&config.chat_template, model.chat_template_source()) {
        (None, None) => None,
        (source, _) => Some(
            model
                .chat_template(source.clone())
                .map_err(|e| format!("chat template: {e}"))?,
        ),
    };
    let slots = config.slots.clamp(1, 64);
    let opts = SessionOptions {
        n_ctx: config.n_ctx,
        n_seq: slots,
        n_batch: config.n_batch,
        exec: config.exec,
        lora: config.lora.clone(),
        ..SessionOptions::default()
    };
    let session = Session::with_options(model.clone(), opts).map_err(|e| e.to_string())?;
    let n_vocab = match model.config().n_vocab {
        Some(n) => n as usize,
        None => model.tokenizer().map_err(|e| e.to_string())?.vocab_size(),
    };
    metrics
        .slots_total
        .store(slots, std::sync::atomic::Ordering::Relaxed);
    let engine = engine::start(session, config.queue, metrics);
    let model_id = config
        .model
        .file_name()
        .map_or_else(|| "model".into(), |f| f.to_string_lossy().into_owned());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Ready {
        model,
        template,
        engine,
        model_id,
        created,
        n_vocab,
    })
}

/// Serves on `listener` until `shutdown` completes, then lets in-flight requests finish for
/// at most 10 s. The model loads in the background; `/health` answers 503 until it is ready.
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    let state = Arc::new(AppState {
        config,
        metrics: Arc::new(Metrics::default()),
        ready: OnceLock::new(),
    });
    let loader = state.clone();
    tokio::task::spawn_blocking(move || {
        let ready = load(&loader.config, loader.metrics.clone());
        match &ready {
            Ok(r) => eprintln!("tnn serve: model '{}' ready", r.model_id),
            Err(e) => eprintln!("tnn serve: loading {}: {e}", loader.config.model.display()),
        }
        let _ = loader.ready.set(ready);
    });
    let stop = Arc::new(tokio::sync::Notify::new());
    let stopped = stop.clone();
    let server = axum::serve(listener, routes::router(state)).with_graceful_shutdown(async move {
        shutdown.await;
        stopped.notify_one();
    });
    tokio::select! {
        r = server => Ok(r?),
        _ = async { stop.notified().await; tokio::time::sleep(DRAIN).await } => Ok(()),
    }
}

/// A server running on its own threads (see [`spawn`]).
pub struct RunningServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), ServerError>>>,
}

impl RunningServer {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Waits until `/health` answers 200 (the model is loaded), or the load failed.
    pub fn wait_ready(&self) -> Result<(), ServerError> {
        loop {
            match health(self.addr) {
                Some(200) => return Ok(()),
                Some(503) | None => {}
                Some(code) => {
                    return Err(ServerError::Load(format!("/health answered {code}")));
                }
            }
            if self.thread.as_ref().is_some_and(|t| t.is_finished()) {
                return Err(ServerError::Load("the server stopped".into()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops it (as a shutdown signal would) and waits for it to end.
    pub fn stop(mut self) -> Result<(), ServerError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), ServerError> {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(r)) => r,
            Some(Err(_)) => Err(ServerError::Load("the server thread panicked".into())),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

/// `GET /health`'s status code, or `None` when nothing answers.
fn health(addr: SocketAddr) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split(' ').nth(1)?.parse().ok()
}

/// Binds `config.host:config.port` and serves on a new thread with its own tokio runtime,
/// until [`RunningServer::stop`] or drop.
pub fn spawn(config: ServerConfig) -> Result<RunningServer, ServerError> {
    let std_listener = std::net::TcpListener::bind((config.host.as_str(), config.port))?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("tinynn-http".into())
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(std_listener)?;
                serve(listener, config, async move {
                    let _ = stop_rx.await;
                })
                .await
            })
        })?;
    Ok(RunningServer {
        addr,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// Serves `config` until SIGINT or SIGTERM (then drains in-flight requests for at most 10 s):
/// what `tnn serve` runs. Prints the address once bound, and when the model is ready.
pub fn run_until_signal(config: ServerConfig) -> Result<(), ServerError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port)).await?;
        let addr = listener.local_addr()?;
        eprintln!(
            "tnn serve: listening on http://{addr} (model {}, {} slots of {} tokens); loading the model...",
            config.model.display(),
            config.slots,
            config.n_ctx / config.slots.clamp(1, 64)
        );
        serve(listener, config, shutdown_signal()).await
    })
}

/// Completes on SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
    eprintln!("tnn serve: shutting down (finishing in-flight requests, at most 10 s)");
}
