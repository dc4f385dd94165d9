//! `--chat-template NAME|JINJA` and `--chat-template-file FILE`, as llama.cpp spells them, for
//! every command that renders conversations (`run --chat`, `chat`, `serve`, `finetune`,
//! `train`). A value that names an existing file is still read as one (tinynn's earlier
//! spelling).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use tinynn_models::chat::ChatTemplate;

#[derive(Args, Clone, Debug, Default)]
pub struct ChatTemplateArgs {
    /// The chat template instead of the model's: a built-in name (chatml, llama3, gemma,
    /// phi3) or the Jinja text itself.
    #[arg(long = "chat-template", value_name = "NAME|JINJA")]
    pub chat_template: Option<String>,
    /// Read the chat template (Jinja) from FILE.
    #[arg(
        long = "chat-template-file",
        value_name = "FILE",
        conflicts_with = "chat_template"
    )]
    pub chat_template_file: Option<PathBuf>,
}

impl ChatTemplateArgs {
    /// The template's Jinja source, or `None` for the model's own.
    pub fn source(&self) -> Result<Option<String>> {
        if let Some(f) = &self.chat_template_file {
            return std::fs::read_to_string(f)
                .map(Some)
                .with_context(|| format!("reading the chat template file {}", f.display()));
        }
        let Some(value) = &self.chat_template else {
            return Ok(None);
        };
        if let Some(source) = ChatTemplate::built_in(value) {
            return Ok(Some(source.to_string()));
        }
        if value.contains("{%") || value.contains("{{") {
            return Ok(Some(value.clone()));
        }
        let path = std::path::Path::new(value);
        if path.is_file() {
            return std::fs::read_to_string(path)
                .map(Some)
                .with_context(|| format!("reading the chat template file {value}"));
        }
        bail!(
            "--chat-template '{value}' is neither a built-in template ({}) nor Jinja text (use --chat-template-file for a file)",
            ChatTemplate::built_in_names().join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_and_unknown_names() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.jinja");
        std::fs::write(&f, "{{ 'x' }}").unwrap();
        let from_file = ChatTemplateArgs {
            chat_template: None,
            chat_template_file: Some(f.clone()),
        };
        assert_eq!(from_file.source().unwrap().as_deref(), Some("{{ 'x' }}"));
        // The earlier spelling: a path given to --chat-template.
        let old = ChatTemplateArgs {
            chat_template: Some(f.to_string_lossy().into_owned()),
            chat_template_file: None,
        };
        assert_eq!(old.source().unwrap().as_deref(), Some("{{ 'x' }}"));
        let unknown = ChatTemplateArgs {
            chat_template: Some("vicuna-9000".into()),
            chat_template_file: None,
        };
        let e = unknown.source().unwrap_err().to_string();
        assert!(e.contains("chatml, llama3, gemma, phi3"), "{e}");
        assert_eq!(ChatTemplateArgs::default().source().unwrap(), None);
    }
}
