//! Training data: sources of fixed-length sequences (packed plain text, JSONL chat samples with
//! loss on the assistant's tokens, pre-tokenized `.bin` files streamed from disk) and the
//! [`Batcher`] that splits, shuffles and batches them resumably.

mod batcher;
mod bin;
mod chat;
mod error;
mod open;
mod source;
mod text;

pub use batcher::{Batch, BatchConfig, Batcher, DataPosition, EvalSplit};
pub use bin::BinTokens;
pub use chat::{
    parse_messages, tokenize_conversation, tokenize_conversation_upto, ChatSamples, MAX_LINE_BYTES,
};
pub use error::DataError;
pub use open::{is_chat, open, Tokenization};
pub use source::{Encode, FnEncoder, Sequences, SourceStats, IGNORE, PAD_INPUT};
pub use text::PackedText;

/// Labels for `ids` (sequences of `seq` tokens, one after another): each token predicts the
/// next one of its sequence, and each sequence's last token is not scored ([`IGNORE`]).
pub fn next_token_labels(ids: &[i32], seq: usize) -> Vec<i32> {
    let mut labels = vec![IGNORE; ids.len()];
    for (l, s) in labels.chunks_mut(seq.max(1)).zip(ids.chunks(seq.max(1))) {
        l[..s.len() - 1].copy_from_slice(&s[1..]);
    }
    labels
}

#[cfg(test)]
mod label_tests {
    #[test]
    fn each_token_predicts_the_next_of_its_sequence() {
        let l = super::next_token_labels(&[1, 2, 3, 4, 5, 6], 3);
        assert_eq!(l, [2, 3, super::IGNORE, 5, 6, super::IGNORE]);
    }
}
