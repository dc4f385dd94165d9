//! Text generation with a per-piece callback that can stop it.

use std::ffi::{c_char, c_void};

use tinynn::{Finish, GenerateOptions};

use crate::args::{put, slice_arg, str_arg};
use crate::sample::{sampling, tnn_sample_default_params, TnnSampleParams};
use crate::session::{with_session, TnnSession};
use crate::status::{guard, Failure, TnnStatus};

/// Why a generation ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TnnFinish {
    /// `max_tokens` reached, or the context is full.
    TNN_FINISH_LENGTH = 0,
    /// The model produced an end-of-text token.
    TNN_FINISH_END_TOKEN = 1,
    /// A stop string appeared (it is not output).
    TNN_FINISH_STOP = 2,
    /// The callback asked to stop.
    TNN_FINISH_CALLBACK = 3,
}

/// What to generate (`tnn_generate_default_params`: 128 tokens, greedy).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TnnGenerateParams {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// How to pick them.
    pub sample: TnnSampleParams,
    /// Keep going past the model's end-of-text tokens.
    pub ignore_eos: bool,
    /// Stop strings (`n_stop` NUL-terminated strings; null when `n_stop` is 0): generation
    /// stops before any of them, which is not output.
    pub stop: *const *const c_char,
    /// How many stop strings.
    pub n_stop: usize,
}

/// 128 tokens, greedy, no stop strings.
#[no_mangle]
pub extern "C" fn tnn_generate_default_params() -> TnnGenerateParams {
    TnnGenerateParams {
        max_tokens: 128,
        sample: tnn_sample_default_params(),
        ignore_eos: false,
        stop: std::ptr::null(),
        n_stop: 0,
    }
}

/// Called for each piece of generated text: `text` (`len` bytes of complete UTF-8, not
/// NUL-terminated, possibly empty while a character or a possible stop string is incomplete),
/// the token sampled for it (-1 for text flushed at the end), and the caller's `user`
/// pointer. Return 0 to go on, anything else to stop. The callback must not call back into
/// this session.
pub type TnnPieceCallback = Option<
    unsafe extern "C" fn(text: *const c_char, len: usize, token: i32, user: *mut c_void) -> i32,
>;

/// Tokenizes `prompt` (with the model's BOS and special tokens), evaluates it on sequence 0
/// (reusing the prefix the sequence already holds) and generates after it, calling `callback`
/// (may be null) with each piece. `*finish` (may be null) gets why it ended.
///
/// # Safety
/// `prompt` is NUL-terminated; `params` null or readable (with `n_stop` readable strings);
/// `finish` writable or null; `callback` a valid function or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_generate(
    session: *mut TnnSession,
    prompt: *const c_char,
    params: *const TnnGenerateParams,
    callback: TnnPieceCallback,
    user: *mut c_void,
    finish: *mut TnnFinish,
) -> TnnStatus {
    guard(|| {
        let prompt = str_arg(prompt, "prompt")?;
        let p = if params.is_null() {
            tnn_generate_default_params()
        } else {
            // SAFETY: a non-null `params` is readable (the API's contract).
            unsafe { params.read() }
        };
        let mut stop = Vec::with_capacity(p.n_stop.min(64));
        for &s in slice_arg(p.stop, p.n_stop, "stop")? {
            stop.push(str_arg(s, "stop string")?.to_string());
        }
        let (strategy, penalties) = sampling(&p.sample)?;
        let opts = GenerateOptions {
            max_tokens: p.max_tokens as usize,
            strategy,
            penalties,
            stop,
            ignore_eos: p.ignore_eos,
        };
        let reason = with_session(session, |st| {
            let mut g = st.session.generate_text(prompt, &opts)?;
            for piece in g.by_ref() {
                let piece = piece?;
                let Some(cb) = callback else { continue };
                let token = piece.token.map_or(-1, |t| t as i32);
                // SAFETY: the caller's callback, with a buffer that lives for the call.
                let verdict = unsafe {
                    cb(
                        piece.text.as_ptr() as *const c_char,
                        piece.text.len(),
                        token,
                        user,
                    )
                };
                if verdict != 0 {
                    return Ok(TnnFinish::TNN_FINISH_CALLBACK);
                }
            }
            Ok(match g.finish_reason() {
                Some(Finish::EndToken) => TnnFinish::TNN_FINISH_END_TOKEN,
                Some(Finish::Stop) => TnnFinish::TNN_FINISH_STOP,
                _ => TnnFinish::TNN_FINISH_LENGTH,
            })
        })?;
        if !finish.is_null() {
            put(finish, reason, "finish")?;
        }
        Ok::<(), Failure>(())
    })
}
