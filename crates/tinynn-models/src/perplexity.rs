//! Perplexity as llama.cpp's `llama-perplexity` computes it: the text is cut into windows of
//! `n_ctx` tokens, each run from an empty cache (its first token replaced by BOS when the model
//! adds one), and only the second half of each window is scored, so every scored token has at
//! least `n_ctx/2` tokens of context. The result is `exp(mean NLL)` with the standard error of
//! the mean carried through: `PPL · sqrt((E[nll²] − E[nll]²) / (count − 1))`.

#![warn(missing_docs)]

use crate::session::Session;
use crate::{ModelError, Result};

/// Progress after one window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ChunkReport {
    /// 1-based window number, and how many there are.
    pub chunk: usize,
    /// Windows scored so far.
    pub n_chunks: usize,
    /// Perplexity over all windows so far.
    pub running_ppl: f64,
}

/// The result of [`perplexity`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Perplexity {
    /// exp of the mean negative log-likelihood.
    pub ppl: f64,
    /// Standard error of the estimate.
    pub error: f64,
    /// Windows scored.
    pub n_chunks: usize,
    /// Tokens scored.
    pub tokens_scored: usize,
}

/// `-log softmax(logits)[target]` in f64.
fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    sum.ln() - f64::from(logits[target as usize] - max)
}

/// Scores `tokens` in windows of the session's context (the session must produce all logits
/// and take a whole window in one batch). `max_chunks` limits the windows; `bos` replaces the
/// first token of each window when given.
pub fn perplexity<B: tinynn_core::backend::Backend>(
    session: &mut Session<B>,
    tokens: &[u32],
    bos: Option<u32>,
    max_chunks: Option<usize>,
    mut progress: impl FnMut(&ChunkReport),
) -> Result<Perplexity> {
    let n_ctx = session.n_ctx();
    if n_ctx < 4 {
        return Err(ModelError::Invalid(format!(
            "a context of {n_ctx} tokens is too small to score"
        )));
    }
    let n_chunks = (tokens.len() / n_ctx).min(max_chunks.unwrap_or(usize::MAX));
    if n_chunks == 0 {
        return Err(ModelError::Invalid(format!(
            "the text is {} tokens, less than one window of {n_ctx}",
            tokens.len()
        )));
    }
    session.set_n_batch(n_ctx);
    let first = n_ctx / 2;
    let (mut sum, mut sum2, mut count) = (0f64, 0f64, 0usize);
    let mut window = Vec::with_capacity(n_ctx);
    for c in 0..n_chunks {
        let orig = &tokens[c * n_ctx..(c + 1) * n_ctx];
        window.clear();
        window.extend_from_slice(orig);
        if let Some(b) = bos {
            window[0] = b;
        }
        session.reset();
        session.eval_batch(&window)?;
        let logits = session.all_logits();
        let n_vocab = logits.len() / n_ctx;
        for j in first..n_ctx - 1 {
            let v = nll(&logits[j * n_vocab..(j + 1) * n_vocab], orig[j + 1]);
            sum += v;
            sum2 += v * v;
            count += 1;
        }
        progress(&ChunkReport {
            chunk: c + 1,
            n_chunks,
            running_ppl: (sum / count as f64).exp(),
        });
    }
    let mean = sum / count as f64;
    let ppl = mean.exp();
    let var = sum2 / count as f64 - mean * mean;
    let error = if var > 0.0 && count > 1 {
        (var / (count - 1) as f64).sqrt() * ppl
    } else {
        0.0
    };
    Ok(Perplexity {
        ppl,
        error,
        n_chunks,
        tokens_scored: count,
    })
}
