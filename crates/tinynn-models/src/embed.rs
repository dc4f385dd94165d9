//! Embeddings (llama.cpp's embedding mode): a text's final normalized hidden states, pooled
//! over its tokens and scaled to unit length.

#![warn(missing_docs)]

use tinynn_core::backend::Backend;

use crate::session::{BatchToken, Session};
use crate::{ModelError, Result};

/// How [`Session::embed`] pools the hidden states of a text's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// The mean over the tokens (llama.cpp's `--pooling mean`).
    #[default]
    Mean,
    /// The last token's state (`--pooling last`).
    Last,
}

impl<B: Backend> Session<B> {
    /// The embeddings of `texts` (each tokenized with the model's BOS), one unit-length vector
    /// of the model's width per text, computed in sequence 0 (cleared before and after).
    pub fn embed_texts(&mut self, texts: &[&str], pooling: Pooling) -> Result<Vec<Vec<f32>>> {
        let tok = self.model().clone();
        let tok = tok.tokenizer()?;
        texts
            .iter()
            .map(|t| self.embed(0, &tok.encode(t, true)?, pooling))
            .collect()
    }

    /// The embedding of `tokens`: the model's final normalized hidden states, pooled and scaled
    /// to unit length (llama.cpp's embedding mode). Runs in sequence `seq`, which is cleared
    /// before and after.
    pub fn embed(&mut self, seq: usize, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
        if tokens.is_empty() {
            return Err(ModelError::Invalid("no tokens to embed".into()));
        }
        self.clear_seq(seq);
        let batch: Vec<BatchToken> =
            BatchToken::sequence(tokens, seq, pooling == Pooling::Mean).collect();
        let result = self.run_batch(&batch, true);
        self.clear_seq(seq);
        result?;
        let rows = self.n_outputs();
        let mut e = vec![0f64; self.row_len];
        for r in 0..rows {
            for (a, &x) in e.iter_mut().zip(self.output(r)) {
                *a += f64::from(x);
            }
        }
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
        let embedding = e.iter().map(|&x| (x * inv) as f32).collect();
        self.out.clear();
        Ok(embedding)
    }
}
