//! Sessions: a KV cache (or recurrent states) for up to 64 sequences over a model, their
//! decode calls, and LoRA adapters applied to them. A session handle is used by one call at a
//! time: concurrent calls on the same session wait for each other; different sessions run in
//! parallel.

use std::ffi::c_char;
use std::sync::{Arc, Mutex, MutexGuard};

use tinynn::{AppliedLora, BatchToken, ExecOptions, LoraAdapter, Pooling, Session, SessionOptions};

use crate::args::{copy_out, put, slice_arg, str_arg};
use crate::handles::{free, get, register};
use crate::model::{model_of, TnnModel};
use crate::status::{guard, Failure, Outcome, TnnStatus};

/// A session over a model. One call at a time (calls from several threads are serialized).
pub struct TnnSession {
    _private: [u8; 0],
}

/// A LoRA adapter file (llama.cpp's GGUF LoRA format). Thread-safe.
pub struct TnnLora {
    _private: [u8; 0],
}

/// How a session is made (`tnn_session_default_params` gives the defaults).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TnnSessionParams {
    /// Tokens the cache holds, shared by all sequences (at most the model's trained context).
    pub n_ctx: u32,
    /// Sequences (1 to 64).
    pub n_seq: u32,
    /// Most tokens per run (longer batches run in pieces).
    pub n_batch: u32,
    /// Threads (at least 1).
    pub n_threads: u32,
    /// Reference mode: f32 cache, f64 sums, no packed weights (slow, exact).
    pub strict: bool,
}

/// The default session: 2048 tokens, one sequence, batches of 512, 1 thread.
#[no_mangle]
pub extern "C" fn tnn_session_default_params() -> TnnSessionParams {
    TnnSessionParams {
        n_ctx: 2048,
        n_seq: 1,
        n_batch: 512,
        n_threads: 1,
        strict: false,
    }
}

/// One token of a batch for `tnn_session_decode`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TnnBatchToken {
    /// The token id.
    pub token: i32,
    /// The sequence it is appended to.
    pub seq: i32,
    /// Whether the call outputs its logits.
    pub logits: bool,
}

pub(crate) struct SessionState {
    pub session: Session,
    pub opts: SessionOptions,
}

pub(crate) type SessionObject = Mutex<SessionState>;

pub(crate) fn with_session<T>(
    handle: *const TnnSession,
    f: impl FnOnce(&mut SessionState) -> Outcome<T>,
) -> Outcome<T> {
    let s = get::<SessionObject, TnnSession>(handle, "session")?;
    let mut guard: MutexGuard<'_, SessionState> = s.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard)
}

fn options(p: &TnnSessionParams) -> Outcome<SessionOptions> {
    if p.n_threads == 0 || p.n_ctx == 0 || p.n_batch == 0 {
        return Err(Failure::invalid(format!(
            "n_ctx, n_batch and n_threads must be at least 1: {p:?}"
        )));
    }
    Ok(SessionOptions {
        n_ctx: p.n_ctx as usize,
        n_seq: p.n_seq as usize,
        n_batch: p.n_batch as usize,
        exec: ExecOptions {
            threads: p.n_threads as usize,
            strict: p.strict,
            ..ExecOptions::default()
        },
        ..SessionOptions::default()
    })
}

/// Makes a session over `model` as `params` says (null: the defaults) into `*out`.
///
/// # Safety
/// `params` is null or a readable `TnnSessionParams`; `out` a writable `TnnSession*`.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_new(
    model: *const TnnModel,
    params: *const TnnSessionParams,
    out: *mut *mut TnnSession,
) -> TnnStatus {
    guard(|| {
        let m = model_of(model)?;
        let p = if params.is_null() {
            tnn_session_default_params()
        } else {
            // SAFETY: a non-null `params` is readable (the API's contract).
            unsafe { params.read() }
        };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let opts = options(&p)?;
        let session = Session::with_options(m.model.clone(), opts.clone())?;
        let state: SessionObject = Mutex::new(SessionState { session, opts });
        put(out, register(state), "out")
    })
}

/// Frees a session handle (null: nothing).
///
/// # Safety
/// `session` is null or a handle from `tnn_session_new` (a stale one is an error).
#[no_mangle]
pub unsafe extern "C" fn tnn_session_free(session: *mut TnnSession) -> TnnStatus {
    guard(|| free::<SessionObject, TnnSession>(session, "session"))
}

fn seq_arg(seq: i32, s: &Session) -> Outcome<usize> {
    if seq < 0 || seq as usize >= s.n_seq() {
        return Err(Failure::invalid(format!(
            "sequence {seq} does not exist (the session holds {})",
            s.n_seq()
        )));
    }
    Ok(seq as usize)
}

fn token_ids(tokens: &[i32]) -> Outcome<Vec<u32>> {
    tokens
        .iter()
        .map(|&t| {
            u32::try_from(t).map_err(|_| Failure::invalid(format!("token id {t} is negative")))
        })
        .collect()
}

/// Appends `n` tokens to sequence `seq` and runs them; `*logits` points at the logits after
/// the last (`*n_vocab` values), valid until the next call on this session. On failure the
/// sequence is as it was.
///
/// # Safety
/// `tokens` holds `n` values; `logits` and `n_vocab` are writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_eval(
    session: *mut TnnSession,
    seq: i32,
    tokens: *const i32,
    n: usize,
    logits: *mut *const f32,
    n_vocab: *mut usize,
) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let s = &mut st.session;
            let seq = seq_arg(seq, s)?;
            let ids = token_ids(slice_arg(tokens, n, "tokens")?)?;
            if ids.is_empty() {
                return Err(Failure::invalid("no tokens to evaluate"));
            }
            let batch: Vec<BatchToken> = BatchToken::sequence(&ids, seq, false).collect();
            s.decode(&batch)?;
            write_row(s.logits(), logits, n_vocab)
        })
    })
}

fn write_row(row: &[f32], ptr: *mut *const f32, len: *mut usize) -> Outcome {
    if !ptr.is_null() {
        // SAFETY: a non-null output pointer is writable (the API's contract).
        unsafe { ptr.write(row.as_ptr()) };
    }
    if !len.is_null() {
        // SAFETY: as above.
        unsafe { len.write(row.len()) };
    }
    Ok(())
}

/// Runs a ragged batch: each token appended to its sequence, all in one pass (prompts of some
/// sequences beside the next tokens of others). The tokens with `logits` set get output rows
/// (`tnn_session_output`). On failure every sequence is as it was.
///
/// # Safety
/// `batch` holds `n` values.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_decode(
    session: *mut TnnSession,
    batch: *const TnnBatchToken,
    n: usize,
) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let s = &mut st.session;
            let items = slice_arg(batch, n, "batch")?;
            if items.is_empty() {
                return Err(Failure::invalid("the batch is empty"));
            }
            let mut b = Vec::with_capacity(items.len());
            for t in items {
                b.push(BatchToken {
                    token: u32::try_from(t.token).map_err(|_| {
                        Failure::invalid(format!("token id {} is negative", t.token))
                    })?,
                    seq: seq_arg(t.seq, s)?,
                    logits: t.logits,
                });
            }
            s.decode(&b)?;
            Ok(())
        })
    })
}

/// The number of output rows of the last `tnn_session_decode`.
///
/// # Safety
/// `n_out` is writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_n_outputs(
    session: *mut TnnSession,
    n_out: *mut usize,
) -> TnnStatus {
    guard(|| with_session(session, |st| put(n_out, st.session.n_outputs(), "n_out")))
}

/// Output row `i` of the last `tnn_session_decode` (the logits after its i-th flagged token):
/// `*logits` (`*n_vocab` values) is valid until the next call on this session.
///
/// # Safety
/// `logits` and `n_vocab` are writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_output(
    session: *mut TnnSession,
    i: usize,
    logits: *mut *const f32,
    n_vocab: *mut usize,
) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let n = st.session.n_outputs();
            if i >= n {
                return Err(Failure::invalid(format!(
                    "output {i} does not exist (the last decode gave {n})"
                )));
            }
            write_row(st.session.output(i), logits, n_vocab)
        })
    })
}

/// The number of tokens sequence `seq` holds.
///
/// # Safety
/// `n` is writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_seq_len(
    session: *mut TnnSession,
    seq: i32,
    n: *mut usize,
) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let seq = seq_arg(seq, &st.session)?;
            put(n, st.session.seq_len(seq), "n")
        })
    })
}

/// Forgets every token of sequence `seq`.
#[no_mangle]
pub extern "C" fn tnn_session_clear(session: *mut TnnSession, seq: i32) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let seq = seq_arg(seq, &st.session)?;
            st.session.clear_seq(seq);
            Ok(())
        })
    })
}

/// Keeps the first `n` tokens of sequence `seq` (a conversation that shares a prefix with
/// what the sequence holds continues from there).
#[no_mangle]
pub extern "C" fn tnn_session_truncate(session: *mut TnnSession, seq: i32, n: usize) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let seq = seq_arg(seq, &st.session)?;
            st.session.truncate_seq(seq, n);
            Ok(())
        })
    })
}

/// Makes the first `n` tokens of sequence `src` the start of sequence `dst` too (a shared
/// prompt prefix).
#[no_mangle]
pub extern "C" fn tnn_session_copy(
    session: *mut TnnSession,
    src: i32,
    dst: i32,
    n: usize,
) -> TnnStatus {
    guard(|| {
        with_session(session, |st| {
            let (src, dst) = (seq_arg(src, &st.session)?, seq_arg(dst, &st.session)?);
            st.session.copy_seq(src, dst, n)?;
            Ok(())
        })
    })
}

/// The embedding of `text` (final normalized hidden states, pooled — 0: mean, 1: last token —
/// and L2-normalized) into `out` (room for `cap` floats); `*n_out` gets its length (the
/// model's width). Uses sequence 0, which is cleared.
///
/// # Safety
/// `text` is NUL-terminated; `out` has room for `cap` floats; `n_out` is writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_embed(
    session: *mut TnnSession,
    text: *const c_char,
    pooling: i32,
    out: *mut f32,
    cap: usize,
    n_out: *mut usize,
) -> TnnStatus {
    guard(|| {
        let text = str_arg(text, "text")?;
        let pooling = match pooling {
            0 => Pooling::Mean,
            1 => Pooling::Last,
            p => {
                return Err(Failure::invalid(format!(
                    "pooling {p} is not 0 (mean) or 1 (last)"
                )))
            }
        };
        with_session(session, |st| {
            let v = st.session.embed_texts(&[text], pooling)?;
            let v = v.into_iter().next().unwrap_or_default();
            copy_out(&v, out, cap, n_out, "out")
        })
    })
}

/// Opens the LoRA adapter at `path` into `*out`.
///
/// # Safety
/// `path` is NUL-terminated; `out` a writable `TnnLora*`.
#[no_mangle]
pub unsafe extern "C" fn tnn_lora_open(path: *const c_char, out: *mut *mut TnnLora) -> TnnStatus {
    guard(|| {
        let path = str_arg(path, "path")?;
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let adapter = Arc::new(LoraAdapter::open(path)?);
        put(out, register(adapter), "out")
    })
}

/// Frees a LoRA handle (null: nothing). Sessions it was applied to keep it.
///
/// # Safety
/// `lora` is null or a handle from `tnn_lora_open`.
#[no_mangle]
pub unsafe extern "C" fn tnn_lora_free(lora: *mut TnnLora) -> TnnStatus {
    guard(|| free::<Arc<LoraAdapter>, TnnLora>(lora, "LoRA adapter"))
}

/// Applies `n` adapters to the session, each at its scale (their branches add up; `n` = 0
/// removes them). The session's passes are rebuilt, so every sequence is cleared.
///
/// # Safety
/// `loras` holds `n` handles and `scales` `n` values.
#[no_mangle]
pub unsafe extern "C" fn tnn_session_set_lora(
    session: *mut TnnSession,
    loras: *const *const TnnLora,
    scales: *const f32,
    n: usize,
) -> TnnStatus {
    guard(|| {
        let handles = slice_arg(loras, n, "loras")?;
        let scales = slice_arg(scales, n, "scales")?;
        let mut applied = Vec::with_capacity(n);
        for (&h, &scale) in handles.iter().zip(scales) {
            let a = get::<Arc<LoraAdapter>, TnnLora>(h, "LoRA adapter")?;
            if !scale.is_finite() {
                return Err(Failure::invalid(format!(
                    "LoRA scale {scale} is not finite"
                )));
            }
            applied.push(AppliedLora {
                adapter: (*a).clone(),
                scale,
            });
        }
        with_session(session, |st| {
            let mut opts = st.opts.clone();
            opts.lora = applied;
            let model = st.session.model().clone();
            st.session = Session::with_options(model, opts.clone())?;
            st.opts = opts;
            Ok(())
        })
    })
}
