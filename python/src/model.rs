//! `tinynn.Model`: a model and a session over it, and `Generation`, the streaming iterator of
//! `generate` / `chat` (a worker thread computes while Python waits without the GIL; Ctrl-C or
//! dropping the iterator stops it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use numpy::{IntoPyArray, PyArray2, PyArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tinynn::models::chat::Message;
use tinynn::{ExecOptions, GenerateOptions, Penalties, Pooling, Session, SessionOptions, Strategy};

use crate::err;

/// A model (GGUF file or Hugging Face directory) with a session of `n_ctx` tokens.
#[pyclass(module = "tinynn")]
pub struct Model {
    pub(crate) model: Arc<tinynn::Model>,
    session: Arc<Mutex<Session>>,
    threads: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Sampling settings from keyword arguments.
#[allow(clippy::too_many_arguments)]
fn options(
    max_tokens: usize,
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    seed: u64,
    repeat_penalty: f32,
    stop: Option<Vec<String>>,
) -> PyResult<GenerateOptions> {
    let finite = [temperature, top_p, min_p, repeat_penalty];
    if finite.iter().any(|v| !v.is_finite())
        || temperature < 0.0
        || !(0.0..=1.0).contains(&top_p)
        || !(0.0..=1.0).contains(&min_p)
        || repeat_penalty <= 0.0
    {
        return Err(PyValueError::new_err(format!(
            "sampling settings out of range: temperature {temperature}, top_p {top_p}, min_p {min_p}, repeat_penalty {repeat_penalty}"
        )));
    }
    let strategy = if temperature == 0.0 {
        Strategy::Greedy
    } else {
        Strategy::Sample {
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
        }
    };
    Ok(GenerateOptions {
        max_tokens,
        strategy,
        penalties: Penalties {
            repeat: repeat_penalty,
            ..Penalties::default()
        },
        stop: stop.unwrap_or_default(),
        ignore_eos: false,
    })
}

enum Event {
    Piece(String),
    Done(Option<String>),
    Failed(String),
}

/// The pieces of a generation, as they come (an iterator of `str`). `finish_reason` is set
/// when it ends: "length", "stop" (an end token or a stop string) or "cancelled".
#[pyclass(module = "tinynn")]
pub struct Generation {
    rx: Mutex<Receiver<Event>>,
    cancel: Arc<AtomicBool>,
    worker: Mutex<Option<JoinHandle<()>>>,
    finish: Mutex<Option<String>>,
}

impl Generation {
    fn start(session: Arc<Mutex<Session>>, prompt: Prompt, opts: GenerateOptions) -> Generation {
        let (tx, rx) = channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let worker = std::thread::spawn(move || {
            let mut s = lock(&session);
            let run = |s: &mut Session| -> Result<Option<String>, String> {
                let mut g = match &prompt {
                    Prompt::Text(t) => s.generate_text(t, &opts),
                    Prompt::Chat(template, messages) => s.chat(template, messages, &opts),
                }
                .map_err(|e| e.to_string())?;
                for piece in g.by_ref() {
                    if flag.load(Ordering::Relaxed) {
                        return Ok(Some("cancelled".into()));
                    }
                    let piece = piece.map_err(|e| e.to_string())?;
                    if !piece.text.is_empty() && tx.send(Event::Piece(piece.text)).is_err() {
                        return Ok(Some("cancelled".into()));
                    }
                }
                Ok(Some(match g.finish_reason() {
                    Some(tinynn::Finish::Length) | None => "length".into(),
                    Some(_) => "stop".into(),
                }))
            };
            let event = match run(&mut s) {
                Ok(reason) => Event::Done(reason),
                Err(e) => Event::Failed(e),
            };
            let _ = tx.send(event);
        });
        Generation {
            rx: Mutex::new(rx),
            cancel,
            worker: Mutex::new(Some(worker)),
            finish: Mutex::new(None),
        }
    }

    fn stop(&self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(w) = lock(&self.worker).take() {
            let _ = w.join();
        }
    }
}

enum Prompt {
    Text(String),
    Chat(tinynn::ChatTemplate, Vec<Message>),
}

#[pymethods]
impl Generation {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<String>> {
        if lock(&self.finish).is_some() {
            return Ok(None);
        }
        loop {
            // Wait without the GIL, a tenth of a second at a time, so Ctrl-C is seen.
            let got = py.allow_threads(|| lock(&self.rx).recv_timeout(Duration::from_millis(100)));
            match got {
                Ok(Event::Piece(text)) => return Ok(Some(text)),
                Ok(Event::Done(reason)) => {
                    *lock(&self.finish) = Some(reason.unwrap_or_else(|| "length".into()));
                    self.stop();
                    return Ok(None);
                }
                Ok(Event::Failed(e)) => {
                    *lock(&self.finish) = Some("error".into());
                    self.stop();
                    return Err(err(e));
                }
                Err(RecvTimeoutError::Timeout) => {
                    if let Err(interrupt) = py.check_signals() {
                        *lock(&self.finish) = Some("cancelled".into());
                        py.allow_threads(|| self.stop());
                        return Err(interrupt);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    *lock(&self.finish) = Some("cancelled".into());
                    return Ok(None);
                }
            }
        }
    }

    /// Why the generation ended ("length", "stop", "cancelled", "error"), or None while it
    /// runs.
    #[getter]
    fn finish_reason(&self) -> Option<String> {
        lock(&self.finish).clone()
    }

    /// Stops the generation (the session keeps what was generated so far).
    fn close(&self, py: Python<'_>) {
        if lock(&self.finish).is_none() {
            *lock(&self.finish) = Some("cancelled".into());
        }
        py.allow_threads(|| self.stop());
    }

    /// The whole text (the rest of the iterator, joined).
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        let mut out = String::new();
        while let Some(piece) = self.__next__(py)? {
            out.push_str(&piece);
        }
        Ok(out)
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A fresh session of `n_ctx` tokens that keeps every token's logits (`logits`, `perplexity`).
fn scoring_session(
    model: Arc<tinynn::Model>,
    n_ctx: usize,
    threads: usize,
) -> tinynn::Result<Session> {
    let opts = SessionOptions {
        n_ctx,
        all_logits: true,
        exec: ExecOptions {
            threads,
            ..ExecOptions::default()
        },
        ..SessionOptions::default()
    };
    Session::with_options(model, opts)
}

fn messages_of(list: &Bound<'_, PyList>) -> PyResult<Vec<Message>> {
    let mut out = Vec::with_capacity(list.len());
    for item in list.iter() {
        let d = item
            .downcast::<PyDict>()
            .map_err(|_| PyValueError::new_err("messages are dicts with 'role' and 'content'"))?;
        let get = |k: &str| -> PyResult<String> {
            d.get_item(k)?
                .ok_or_else(|| PyValueError::new_err(format!("a message lacks '{k}'")))?
                .extract()
        };
        out.push(Message {
            role: get("role")?,
            content: get("content")?,
        });
    }
    Ok(out)
}

#[pymethods]
impl Model {
    /// Opens `path` (a GGUF file or a Hugging Face directory; None: the default model) with a
    /// session of `n_ctx` tokens on `threads` threads.
    #[new]
    #[pyo3(signature = (path=None, n_ctx=2048, threads=2))]
    fn new(py: Python<'_>, path: Option<String>, n_ctx: usize, threads: usize) -> PyResult<Model> {
        if threads == 0 || n_ctx == 0 {
            return Err(PyValueError::new_err(
                "n_ctx and threads must be at least 1",
            ));
        }
        let path = match path {
            Some(p) => std::path::PathBuf::from(p),
            None => tinynn::default_model().map_err(err)?,
        };
        py.allow_threads(|| {
            let model = tinynn::Model::open(&path).map_err(|e| e.to_string())?;
            let exec = ExecOptions {
                threads,
                ..ExecOptions::default()
            };
            let session = Session::new(model.clone(), n_ctx, exec).map_err(|e| e.to_string())?;
            Ok::<Model, String>(Model {
                model,
                session: Arc::new(Mutex::new(session)),
                threads,
            })
        })
        .map_err(err)
    }

    /// The architecture name as GGUF files spell it ("llama", "gemma3", "mamba", ...).
    #[getter]
    fn architecture(&self) -> String {
        self.model.config().architecture.name().to_string()
    }

    /// The vocabulary size.
    #[getter]
    fn n_vocab(&self) -> u64 {
        self.model.config().n_vocab.unwrap_or(0)
    }

    /// The width of the residual stream (the embeddings' length).
    #[getter]
    fn n_embd(&self) -> u64 {
        self.model.config().n_embd
    }

    /// The context the model was trained with (None when the file does not say).
    #[getter]
    fn n_ctx_train(&self) -> Option<u64> {
        self.model.config().n_ctx_train
    }

    /// The path the model was opened from.
    #[getter]
    fn path(&self) -> String {
        self.model.path().display().to_string()
    }

    /// Token ids of `text` (with the model's BOS and special tokens when `add_special`).
    #[pyo3(signature = (text, add_special=true))]
    fn tokenize(&self, text: &str, add_special: bool) -> PyResult<Vec<u32>> {
        let t = self.model.tokenizer().map_err(err)?;
        t.encode(text, add_special).map_err(err)
    }

    /// The text of token ids.
    fn detokenize(&self, ids: Vec<u32>) -> PyResult<String> {
        let t = self.model.tokenizer().map_err(err)?;
        let v = t.vocab_size();
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
            return Err(PyValueError::new_err(format!(
                "token id {bad} is outside the vocabulary of {v}"
            )));
        }
        t.decode(&ids).map_err(err)
    }

    /// Generates after `prompt` (its prefix already in the session is reused), streaming the
    /// text: `for piece in model.generate(...)`. temperature 0 is greedy.
    #[pyo3(signature = (prompt, max_tokens=128, temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, seed=0, repeat_penalty=1.0, stop=None))]
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        prompt: String,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        seed: u64,
        repeat_penalty: f32,
        stop: Option<Vec<String>>,
    ) -> PyResult<Generation> {
        let opts = options(
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            repeat_penalty,
            stop,
        )?;
        Ok(Generation::start(
            self.session.clone(),
            Prompt::Text(prompt),
            opts,
        ))
    }

    /// The assistant's reply to `messages` (`[{"role": ..., "content": ...}, ...]`) with the
    /// model's chat template, streamed as `generate` streams.
    #[pyo3(signature = (messages, max_tokens=256, temperature=0.0, top_k=40, top_p=0.95, min_p=0.05, seed=0, repeat_penalty=1.0, stop=None))]
    #[allow(clippy::too_many_arguments)]
    fn chat(
        &self,
        messages: &Bound<'_, PyList>,
        max_tokens: usize,
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        seed: u64,
        repeat_penalty: f32,
        stop: Option<Vec<String>>,
    ) -> PyResult<Generation> {
        let messages = messages_of(messages)?;
        let template = self.model.chat_template(None).map_err(err)?;
        let opts = options(
            max_tokens,
            temperature,
            top_k,
            top_p,
            min_p,
            seed,
            repeat_penalty,
            stop,
        )?;
        Ok(Generation::start(
            self.session.clone(),
            Prompt::Chat(template, messages),
            opts,
        ))
    }

    /// Embeddings of `texts` (final normalized hidden states pooled by "mean" or "last",
    /// L2-normalized): a float32 array `[len(texts), n_embd]`.
    #[pyo3(signature = (texts, pooling="mean"))]
    fn embed<'py>(
        &self,
        py: Python<'py>,
        texts: Vec<String>,
        pooling: &str,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let pooling = match pooling {
            "mean" => Pooling::Mean,
            "last" => Pooling::Last,
            p => {
                return Err(PyValueError::new_err(format!(
                    "pooling '{p}' is not 'mean' or 'last'"
                )))
            }
        };
        let session = self.session.clone();
        let rows = py
            .allow_threads(|| {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                lock(&session).embed_texts(&refs, pooling)
            })
            .map_err(err)?;
        let d = self.model.config().n_embd as usize;
        let flat: Vec<f32> = rows.into_iter().flatten().collect();
        let n = flat.len() / d.max(1);
        flat.into_pyarray(py).reshape([n, d])
    }

    /// The logits after every token of `tokens` (a fresh sequence): float32 `[len(tokens),
    /// n_vocab]`.
    fn logits<'py>(
        &self,
        py: Python<'py>,
        tokens: Vec<u32>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if tokens.is_empty() {
            return Err(PyValueError::new_err("no tokens"));
        }
        let model = self.model.clone();
        let threads = self.threads;
        let n = tokens.len();
        let flat = py
            .allow_threads(|| {
                let mut s = scoring_session(model, n.max(4), threads)?;
                s.eval_batch(&tokens)?;
                Ok::<_, tinynn::ModelError>(s.all_logits().to_vec())
            })
            .map_err(err)?;
        let v = flat.len() / n;
        flat.into_pyarray(py).reshape([n, v])
    }

    /// Perplexity of `text` in windows of `n_ctx` tokens (llama.cpp's scoring: the second
    /// half of each window).
    #[pyo3(signature = (text, n_ctx=512))]
    fn perplexity(&self, py: Python<'_>, text: String, n_ctx: usize) -> PyResult<f64> {
        let model = self.model.clone();
        let threads = self.threads;
        py.allow_threads(|| {
            let tokenizer = model.tokenizer()?;
            let tokens = tokenizer.encode(&text, false)?;
            let bos = tokenizer.bos();
            let mut s = scoring_session(model.clone(), n_ctx, threads)?;
            Ok::<_, tinynn::ModelError>(tinynn::perplexity(&mut s, &tokens, bos, None, |_| {})?.ppl)
        })
        .map_err(err)
    }

    /// Forgets what the session holds (the next prompt is evaluated whole).
    fn reset(&self) {
        lock(&self.session).reset();
    }
}
