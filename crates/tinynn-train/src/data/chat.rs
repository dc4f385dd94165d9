//! JSONL chat samples (`{"messages":[{"role":..,"content":..},..]}` per line), rendered with the
//! model's chat template, with loss only on the assistant's tokens.
//!
//! Finding the assistant spans: for every assistant message k, the conversation before it is
//! rendered with the generation prompt (`render(m[..k], true)`, which ends with the assistant's
//! turn opener) and the conversation through it without (`render(m[..=k], false)`). Both must be
//! prefixes of the whole conversation's rendering, otherwise the template is refused for that
//! line (an error, never a guessed span). The text between the two is the assistant's span: its
//! content and the template's end-of-turn text (`<|im_end|>\n` in ChatML), so the model learns
//! to stop. The rendering is then tokenized piece by piece (outside / inside spans), so the
//! token boundaries fall exactly on the span boundaries; for templates whose turns are
//! delimited by special tokens (ChatML, Llama 3, ...) this equals tokenizing the whole text.
//!
//! Each sample becomes one sequence: longer ones are truncated (counted), shorter ones padded
//! with labels −1. Samples with no assistant token left are skipped (counted). Turns past the
//! sequence are never rendered: a conversation is tokenized only until it holds one token
//! more than a sequence takes, so a line of many short turns costs as much as its first
//! sequence, not its turns × its length (each turn renders the conversation up to it).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use tinynn_models::chat::{ChatTemplate, Message};

use super::source::{fill_window, Encode, Sequences, SourceStats};
use super::DataError;

pub struct ChatSamples {
    seq: usize,
    /// All samples' tokens (at most `seq + 1` each), one after another.
    tokens: Vec<u32>,
    /// Whether each token is an assistant token (a loss target).
    target: Vec<bool>,
    /// Start of each sample in `tokens`, plus the end.
    offsets: Vec<usize>,
    stats: SourceStats,
}

/// Parses one JSONL line into messages.
pub fn parse_messages(line: &str) -> Result<Vec<Message>, String> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("bad JSON: {e}"))?;
    let msgs = v
        .get("messages")
        .and_then(|m| m.as_array())
        .ok_or("no \"messages\" array")?;
    if msgs.is_empty() {
        return Err("\"messages\" is empty".into());
    }
    msgs.iter()
        .enumerate()
        .map(|(i, m)| {
            let field = |k: &str| {
                m.get(k)
                    .and_then(|x| x.as_str())
                    .ok_or_else(|| format!("message {i} has no \"{k}\" string"))
            };
            let role = field("role")?;
            if role.is_empty() {
                return Err(format!("message {i} has an empty role"));
            }
            Ok(Message::new(role, field("content")?))
        })
        .collect()
}

/// Token ids of a rendered conversation and whether each is an assistant token.
pub fn tokenize_conversation(
    messages: &[Message],
    template: &ChatTemplate,
    encoder: &dyn Encode,
) -> Result<(Vec<u32>, Vec<bool>), String> {
    tokenize_conversation_upto(messages, template, encoder, usize::MAX)
}

/// [`tokenize_conversation`], stopping once at least `limit` tokens are out (what follows is
/// neither rendered per turn nor tokenized; the result may hold more than `limit` tokens).
pub fn tokenize_conversation_upto(
    messages: &[Message],
    template: &ChatTemplate,
    encoder: &dyn Encode,
    limit: usize,
) -> Result<(Vec<u32>, Vec<bool>), String> {
    let render = |m: &[Message], gen: bool| template.render(m, gen).map_err(|e| e.to_string());
    let full = render(messages, false)?;
    let mut tokens = Vec::new();
    let mut target = Vec::new();
    let mut piece = |text: &str, is_target: bool| -> Result<usize, String> {
        if !text.is_empty() {
            let ids = encoder
                .encode(text)
                .map_err(|e| format!("tokenizing: {e}"))?;
            target.extend(std::iter::repeat_n(is_target, ids.len()));
            tokens.extend(ids);
        }
        Ok(tokens.len())
    };
    // Byte offset of the text not tokenized yet; the spans are cut there in order.
    let mut at = 0;
    let mut n_tokens = 0;
    for (k, m) in messages.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        if n_tokens >= limit {
            break;
        }
        let before = render(&messages[..k], true)?;
        let through = render(&messages[..=k], false)?;
        if !full.starts_with(&before) || !full.starts_with(&through) || through.len() < before.len()
        {
            return Err(format!(
                "the chat template does not render the conversation up to message {k} as a \
                 prefix of the whole; cannot find the assistant's tokens"
            ));
        }
        if before.len() < at {
            return Err(format!("assistant message {k} overlaps the previous one"));
        }
        piece(&full[at..before.len()], false)?;
        n_tokens = piece(&full[before.len()..through.len()], true)?;
        at = through.len();
    }
    if n_tokens < limit {
        piece(&full[at..], false)?;
    }
    Ok((tokens, target))
}

/// Longest JSONL line read (a chat sample this long is millions of tokens, far past any
/// sequence length).
pub const MAX_LINE_BYTES: usize = 16 << 20;

impl ChatSamples {
    /// Reads a JSONL file; blank lines are skipped, any other bad line is an error naming it.
    pub fn from_jsonl(
        path: &Path,
        template: &ChatTemplate,
        encoder: &dyn Encode,
        seq: usize,
    ) -> Result<ChatSamples, DataError> {
        let file = std::fs::File::open(path).map_err(|e| DataError::io(path, e))?;
        let mut reader = BufReader::new(file);
        let mut lines = Vec::new();
        for no in 1.. {
            // At most one byte past the cap is read: a longer line is refused unread.
            let mut buf = Vec::new();
            let cap = (MAX_LINE_BYTES + 1) as u64;
            let n = (&mut reader)
                .take(cap)
                .read_until(b'\n', &mut buf)
                .map_err(|e| DataError::io(path, e))?;
            if n == 0 {
                break;
            }
            if buf.last() == Some(&b'\n') {
                buf.pop();
            } else if buf.len() > MAX_LINE_BYTES {
                let msg = format!("longer than {MAX_LINE_BYTES} bytes");
                return Err(DataError::line(path, no, msg));
            }
            if buf.last() == Some(&b'\r') {
                buf.pop();
            }
            let line =
                String::from_utf8(buf).map_err(|_| DataError::line(path, no, "not UTF-8"))?;
            lines.push((no, line));
        }
        Self::from_lines(path, lines, template, encoder, seq)
    }

    /// Samples from (line number, JSON text) pairs; `path` names them in errors.
    pub fn from_lines(
        path: &Path,
        lines: impl IntoIterator<Item = (usize, String)>,
        template: &ChatTemplate,
        encoder: &dyn Encode,
        seq: usize,
    ) -> Result<ChatSamples, DataError> {
        if seq == 0 {
            return Err(DataError::Config(
                "sequence length must be at least 1".into(),
            ));
        }
        let mut out = ChatSamples {
            seq,
            tokens: Vec::new(),
            target: Vec::new(),
            offsets: vec![0],
            stats: SourceStats::default(),
        };
        for (no, line) in lines {
            if line.trim().is_empty() {
                continue;
            }
            let messages = parse_messages(&line).map_err(|m| DataError::line(path, no, m))?;
            // One token past the sequence tells a truncated sample from one that fits.
            let (mut ids, mut target) =
                tokenize_conversation_upto(&messages, template, encoder, seq + 2)
                    .map_err(|m| DataError::line(path, no, m))?;
            out.stats.tokens += ids.len() as u64;
            let truncated = ids.len() > seq + 1;
            ids.truncate(seq + 1);
            target.truncate(seq + 1);
            // Position 0 is never a label, so a loss needs a target after it.
            if !target.iter().skip(1).any(|&t| t) {
                out.stats.skipped += 1;
                continue;
            }
            out.stats.truncated += usize::from(truncated);
            out.stats.padded += (seq + 1 - ids.len()) as u64;
            out.tokens.extend(ids);
            out.target.extend(target);
            out.offsets.push(out.tokens.len());
        }
        if out.offsets.len() == 1 {
            return Err(DataError::file(
                path,
                format!(
                    "no usable chat samples ({} had no assistant tokens)",
                    out.stats.skipped
                ),
            ));
        }
        out.stats.sequences = out.offsets.len() - 1;
        Ok(out)
    }
}

impl std::fmt::Debug for ChatSamples {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatSamples")
            .field("seq", &self.seq)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Sequences for ChatSamples {
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    fn seq_len(&self) -> usize {
        self.seq
    }

    fn read(&self, i: usize, inputs: &mut [i32], labels: &mut [i32]) -> Result<(), DataError> {
        if i >= self.len() {
            return Err(DataError::Config(format!(
                "sample {i} of {} does not exist",
                self.len()
            )));
        }
        let (a, b) = (self.offsets[i], self.offsets[i + 1]);
        let target = &self.target[a..b];
        fill_window(&self.tokens[a..b], |j| target[j], inputs, labels);
        Ok(())
    }

    fn stats(&self) -> SourceStats {
        self.stats
    }
}
