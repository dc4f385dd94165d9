//! What `tnn chat` reads: lines from a terminal (with rustyline's line editing and a history
//! file) or from a pipe, gathered into one message (a line ending in `\` continues; `"""` opens
//! and closes a block), and the `/` commands among them.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::Result;
use rustyline::error::ReadlineError;

/// One thing the user typed.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// A message for the model.
    Message(String),
    /// A `/` command.
    Command(Command),
    /// End of input (Ctrl-D, or the end of a piped file).
    Eof,
}

/// The `/` commands.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Help,
    /// Forget the conversation (the system prompt stays).
    Clear,
    /// Write the conversation as JSON to a file.
    Save(String),
    Exit,
    /// Anything else that starts with `/`.
    Unknown(String),
}

pub const HELP: &str = "\
  /help         this list
  /clear        forget the conversation (the system prompt stays)
  /save FILE    write the conversation to FILE as JSON ([{\"role\": ..., \"content\": ...}])
  /exit         quit (also /quit, /bye, Ctrl-D)
  A line ending in \\ continues on the next line; \"\"\" opens and closes a block of lines.
  Start a message with // to send one that begins with /.
  Ctrl-C stops a reply; at the prompt it clears the line.";

/// Reads the user's lines.
pub struct Reader {
    source: Source,
}

enum Source {
    Terminal {
        editor: Box<rustyline::DefaultEditor>,
        history: Option<PathBuf>,
    },
    Pipe(std::io::StdinLock<'static>),
}

/// A raw line read, before messages are gathered.
enum Line {
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    Eof,
}

impl Reader {
    /// A terminal reader with line editing when stdin and stdout are terminals (history kept
    /// in `history` when given), else a plain line reader.
    pub fn new(history: Option<PathBuf>) -> Result<Reader> {
        if std::io::stdin().is_terminal() && std::io::stdout().is_terminal() {
            let mut editor = rustyline::DefaultEditor::new()?;
            if let Some(h) = &history {
                // A missing or unreadable history file only means no history yet.
                let _ = editor.load_history(h);
            }
            Ok(Reader {
                source: Source::Terminal {
                    editor: Box::new(editor),
                    history,
                },
            })
        } else {
            Ok(Reader {
                source: Source::Pipe(std::io::stdin().lock()),
            })
        }
    }

    /// Whether the user types at a terminal (prompts and hints are shown).
    pub fn interactive(&self) -> bool {
        matches!(self.source, Source::Terminal { .. })
    }

    fn line(&mut self, prompt: &str) -> Result<Line> {
        match &mut self.source {
            Source::Terminal { editor, .. } => match editor.readline(prompt) {
                Ok(l) => Ok(Line::Text(l)),
                Err(ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(ReadlineError::Eof) => Ok(Line::Eof),
                Err(e) => Err(e.into()),
            },
            Source::Pipe(stdin) => {
                let mut l = String::new();
                if stdin.read_line(&mut l)? == 0 {
                    return Ok(Line::Eof);
                }
                while l.ends_with(['\n', '\r']) {
                    l.pop();
                }
                Ok(Line::Text(l))
            }
        }
    }

    /// The next message or command. Empty lines are skipped; Ctrl-C at the prompt drops what
    /// was typed (and says how to quit).
    pub fn next(&mut self) -> Result<Input> {
        loop {
            let first = match self.line("> ")? {
                Line::Eof => return Ok(Input::Eof),
                Line::Interrupted => {
                    eprintln!("(Ctrl-D or /exit quits)");
                    continue;
                }
                Line::Text(l) => l,
            };
            if first.trim().is_empty() {
                continue;
            }
            let Some(text) = self.gather(first)? else {
                continue;
            };
            self.remember(&text);
            return Ok(parse(&text));
        }
    }

    /// The whole message that starts with `first`: continued lines and `"""` blocks joined.
    /// `None` when Ctrl-C dropped it.
    fn gather(&mut self, first: String) -> Result<Option<String>> {
        if first.trim() == "\"\"\"" || first.trim_start().starts_with("\"\"\"") {
            // A block: everything up to a line that ends with """.
            let mut text = first.trim_start()[3..].to_string();
            if let Some(done) = text.strip_suffix("\"\"\"") {
                return Ok(Some(done.to_string()));
            }
            loop {
                match self.line("... ")? {
                    Line::Text(l) => {
                        if let Some(last) = l.strip_suffix("\"\"\"") {
                            push_line(&mut text, last);
                            return Ok(Some(text.trim_matches('\n').to_string()));
                        }
                        push_line(&mut text, &l);
                    }
                    Line::Interrupted => return Ok(None),
                    Line::Eof => return Ok(Some(text.trim_matches('\n').to_string())),
                }
            }
        }
        let mut text = String::new();
        let mut line = first;
        loop {
            match line.strip_suffix('\\') {
                Some(part) => {
                    push_line(&mut text, part);
                    line = match self.line("... ")? {
                        Line::Text(l) => l,
                        Line::Interrupted => return Ok(None),
                        Line::Eof => return Ok(Some(text)),
                    };
                }
                None => {
                    push_line(&mut text, &line);
                    return Ok(Some(text));
                }
            }
        }
    }

    fn remember(&mut self, text: &str) {
        if let Source::Terminal { editor, history } = &mut self.source {
            let _ = editor.add_history_entry(text);
            if let Some(h) = history {
                if let Some(dir) = h.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                // History is a convenience: failing to save it is not an error.
                let _ = editor.save_history(h);
            }
        }
    }
}

fn push_line(text: &mut String, line: &str) {
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(line);
}

/// A gathered text as a message or a `/` command (`//` escapes a leading `/`).
pub fn parse(text: &str) -> Input {
    if let Some(rest) = text.strip_prefix("//") {
        return Input::Message(format!("/{rest}"));
    }
    let Some(cmd) = text.strip_prefix('/') else {
        return Input::Message(text.to_string());
    };
    let cmd = cmd.trim();
    let (name, arg) = cmd.split_once(char::is_whitespace).unwrap_or((cmd, ""));
    let arg = arg.trim();
    Input::Command(match (name, arg.is_empty()) {
        ("help" | "?", true) => Command::Help,
        ("clear" | "reset", true) => Command::Clear,
        ("exit" | "quit" | "bye", true) => Command::Exit,
        ("save", false) => Command::Save(arg.to_string()),
        _ => Command::Unknown(text.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_messages() {
        for (text, want) in [
            ("hello", Input::Message("hello".into())),
            ("/help", Input::Command(Command::Help)),
            ("/?", Input::Command(Command::Help)),
            ("/clear", Input::Command(Command::Clear)),
            (" /exit", Input::Message(" /exit".into())),
            ("/bye", Input::Command(Command::Exit)),
            ("/quit ", Input::Command(Command::Exit)),
            (
                "/save  a b.json ",
                Input::Command(Command::Save("a b.json".into())),
            ),
            ("/save", Input::Command(Command::Unknown("/save".into()))),
            (
                "/clear now",
                Input::Command(Command::Unknown("/clear now".into())),
            ),
            (
                "/frobnicate",
                Input::Command(Command::Unknown("/frobnicate".into())),
            ),
            (
                "//etc/passwd is a file",
                Input::Message("/etc/passwd is a file".into()),
            ),
        ] {
            assert_eq!(parse(text), want, "{text:?}");
        }
    }
}
