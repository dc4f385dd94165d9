//! What the batcher reads from: a numbered set of fixed-length training sequences, and the
//! text-to-ids function the text and chat sources tokenize with.

use super::DataError;

/// Label of a position that carries no loss.
pub const IGNORE: i32 = -1;

/// Input id written at padding positions. Padding always follows the real tokens of a
/// sequence, so under causal attention it never affects them, and its labels are [`IGNORE`].
pub const PAD_INPUT: i32 = 0;

/// A numbered set of sequences of `seq_len()` positions.
pub trait Sequences: Send + Sync {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions per sequence.
    fn seq_len(&self) -> usize;

    /// Writes sequence `i`'s inputs and labels (`seq_len()` each; labels [`IGNORE`] where no
    /// loss is wanted).
    fn read(&self, i: usize, inputs: &mut [i32], labels: &mut [i32]) -> Result<(), DataError>;

    /// Counters about how the data was made (truncation, padding, skipped samples).
    fn stats(&self) -> SourceStats;
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceStats {
    pub sequences: usize,
    /// Tokens in the source (before packing / truncation).
    pub tokens: u64,
    /// Samples longer than a sequence, cut to fit (and kept).
    pub truncated: usize,
    /// Samples dropped because nothing in them carries loss (no assistant turn, or none left
    /// after truncation).
    pub skipped: usize,
    /// Padding positions (labels [`IGNORE`]).
    pub padded: u64,
}

/// Text → token ids, without BOS/EOS (sources add those themselves). Implemented for the
/// model's [`Tokenizer`](tinynn_models::tokenizer::Tokenizer) and, through [`FnEncoder`], for
/// any closure.
pub trait Encode {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
}

impl Encode for tinynn_models::tokenizer::Tokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        tinynn_models::tokenizer::Tokenizer::encode(self, text, false).map_err(|e| e.to_string())
    }
}

/// A closure as an [`Encode`].
pub struct FnEncoder<F>(pub F);

impl<F: Fn(&str) -> Vec<u32>> Encode for FnEncoder<F> {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok((self.0)(text))
    }
}

/// Fills `inputs`/`labels` from `window` (up to `seq + 1` tokens; labels are the next tokens,
/// kept where `keep(j + 1)`), padding the rest. Returns the number of padded positions.
pub(crate) fn fill_window(
    window: &[u32],
    keep: impl Fn(usize) -> bool,
    inputs: &mut [i32],
    labels: &mut [i32],
) -> usize {
    let real = window.len().saturating_sub(1).min(inputs.len());
    for j in 0..real {
        inputs[j] = window[j] as i32;
        labels[j] = if keep(j + 1) {
            window[j + 1] as i32
        } else {
            IGNORE
        };
    }
    inputs[real..].fill(PAD_INPUT);
    labels[real..].fill(IGNORE);
    inputs.len() - real
}
