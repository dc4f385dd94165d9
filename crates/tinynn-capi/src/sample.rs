//! Sampling with a parameter struct: a sampler keeps its penalty history and random state
//! between calls. A sampler handle is used by one call at a time.

use std::sync::Mutex;

use tinynn::{Penalties, Sampler, Strategy};

use crate::args::{put, slice_arg};
use crate::handles::{free, get, register};
use crate::status::{guard, Failure, Outcome, TnnStatus};

/// A sampler (penalties, filters, seeded draw).
pub struct TnnSampler {
    _private: [u8; 0],
}

/// How to pick tokens (`tnn_sample_default_params`: greedy, no penalties).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TnnSampleParams {
    /// 0: greedy (the most likely token); above 0: divides the logits before the draw.
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    pub top_k: u32,
    /// Keep the smallest set whose probability reaches p (1: all).
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one (0: none).
    pub min_p: f32,
    /// Seed of the draw.
    pub seed: u64,
    /// Divides positive logits of recent tokens and multiplies negative ones (1: off).
    pub repeat_penalty: f32,
    /// Subtracted once from a recent token's logit (0: off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence (0: off).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: u32,
}

/// Greedy, no penalties (seed 0, top_k 40, top_p 0.95, min_p 0.05 for when temperature is
/// raised).
#[no_mangle]
pub extern "C" fn tnn_sample_default_params() -> TnnSampleParams {
    TnnSampleParams {
        temperature: 0.0,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        seed: 0,
        repeat_penalty: 1.0,
        presence_penalty: 0.0,
        frequency_penalty: 0.0,
        penalty_last_n: 64,
    }
}

/// The strategy and penalties of `p`, checked.
pub(crate) fn sampling(p: &TnnSampleParams) -> Outcome<(Strategy, Penalties)> {
    let finite = [
        p.temperature,
        p.top_p,
        p.min_p,
        p.repeat_penalty,
        p.presence_penalty,
        p.frequency_penalty,
    ];
    if finite.iter().any(|v| !v.is_finite()) || p.temperature < 0.0 || p.repeat_penalty <= 0.0 {
        return Err(Failure::invalid(format!(
            "sampling parameters must be finite, temperature ≥ 0 and repeat_penalty > 0: {p:?}"
        )));
    }
    if !(0.0..=1.0).contains(&p.top_p) || !(0.0..=1.0).contains(&p.min_p) {
        return Err(Failure::invalid(format!(
            "top_p and min_p must be in [0, 1]: {p:?}"
        )));
    }
    let strategy = if p.temperature == 0.0 {
        Strategy::Greedy
    } else {
        Strategy::Sample {
            temperature: p.temperature,
            top_k: p.top_k as usize,
            top_p: p.top_p,
            min_p: p.min_p,
            seed: p.seed,
        }
    };
    let penalties = Penalties {
        repeat: p.repeat_penalty,
        presence: p.presence_penalty,
        frequency: p.frequency_penalty,
        last_n: p.penalty_last_n as usize,
    };
    Ok((strategy, penalties))
}

type SamplerObject = Mutex<Sampler>;

/// Makes a sampler (null params: the defaults) into `*out`.
///
/// # Safety
/// `params` is null or readable; `out` a writable `TnnSampler*`.
#[no_mangle]
pub unsafe extern "C" fn tnn_sampler_new(
    params: *const TnnSampleParams,
    out: *mut *mut TnnSampler,
) -> TnnStatus {
    guard(|| {
        let p = if params.is_null() {
            tnn_sample_default_params()
        } else {
            // SAFETY: a non-null `params` is readable (the API's contract).
            unsafe { params.read() }
        };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let (strategy, penalties) = sampling(&p)?;
        let s: SamplerObject = Mutex::new(Sampler::new(strategy, penalties));
        put(out, register(s), "out")
    })
}

/// Frees a sampler handle (null: nothing).
///
/// # Safety
/// `sampler` is null or a handle from `tnn_sampler_new`.
#[no_mangle]
pub unsafe extern "C" fn tnn_sampler_free(sampler: *mut TnnSampler) -> TnnStatus {
    guard(|| free::<SamplerObject, TnnSampler>(sampler, "sampler"))
}

/// Picks a token from `n` logits into `*token` and records it in the penalty history.
///
/// # Safety
/// `logits` holds `n` values; `token` is writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_sampler_sample(
    sampler: *mut TnnSampler,
    logits: *const f32,
    n: usize,
    token: *mut i32,
) -> TnnStatus {
    guard(|| {
        let s = get::<SamplerObject, TnnSampler>(sampler, "sampler")?;
        let logits = slice_arg(logits, n, "logits")?;
        if logits.is_empty() {
            return Err(Failure::invalid("no logits to sample from"));
        }
        let mut s = s.lock().unwrap_or_else(|p| p.into_inner());
        let t = s.sample(logits);
        s.accept(t);
        put(token, t as i32, "token")
    })
}

/// Records `token` in the penalty history without sampling (a prompt's tokens).
#[no_mangle]
pub extern "C" fn tnn_sampler_accept(sampler: *mut TnnSampler, token: i32) -> TnnStatus {
    guard(|| {
        let s = get::<SamplerObject, TnnSampler>(sampler, "sampler")?;
        let t = u32::try_from(token)
            .map_err(|_| Failure::invalid(format!("token id {token} is negative")))?;
        s.lock().unwrap_or_else(|p| p.into_inner()).accept(t);
        Ok(())
    })
}
