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
