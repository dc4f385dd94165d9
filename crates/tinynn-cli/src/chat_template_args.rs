//! `--chat-template NAME|JINJA` and `--chat-template-file FILE`, as llama.cpp spells them, for
//! every command that renders conversations (`run --chat`, `chat`, `serve`, `finetune`,
//! `train`). A value that names an existing file is still read as one (tinynn's earlier
//! spelling).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

/// Built-in templates: (name, Jinja source).
const BUILT_IN: [(&str, &str); 4] = [
    (
        "chatml",
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
    ),
    (
        "llama3",
        "{{- bos_token }}{%- for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}",
    ),
    (
        "gemma",
        "{{- bos_token }}{%- set ns = namespace(sys='') %}{%- for m in messages %}\
         {%- if m['role'] == 'system' %}{%- set ns.sys = m['content'] | trim + '\\n\\n' %}\
         {%- else %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' + ns.sys + m['content'] | trim + '<end_of_turn>\\n' }}{%- set ns.sys = '' %}\
         {%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{%- endif %}",
    ),
    (
        "phi3",
        "{%- for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}{%- endfor %}\
         {%- if add_generation_prompt %}{{ '<|assistant|>\\n' }}{%- endif %}",
    ),
];

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
        if let Some((_, source)) = BUILT_IN.iter().find(|(n, _)| n == value) {
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
        let names: Vec<&str> = BUILT_IN.iter().map(|(n, _)| *n).collect();
        bail!(
            "--chat-template '{value}' is neither a built-in template ({}) nor Jinja text (use --chat-template-file for a file)",
            names.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tinynn_models::chat::{ChatTemplate, Message};

    fn render(name: &str, messages: &[Message]) -> String {
        let args = ChatTemplateArgs {
            chat_template: Some(name.into()),
            chat_template_file: None,
        };
        let source = args.source().unwrap().unwrap();
        ChatTemplate::new(source, "<BOS>", "<EOS>")
            .render(messages, true)
            .unwrap()
    }

    #[test]
    fn built_in_templates_render_as_their_models_expect() {
        let m = [
            Message::new("system", "Be brief."),
            Message::new("user", "Hi "),
            Message::new("assistant", "Hello."),
            Message::new("user", "Bye"),
        ];
        assert_eq!(
            render("chatml", &m),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi <|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(
            render("llama3", &m),
            "<BOS><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        assert_eq!(
            render("gemma", &m),
            "<BOS><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(
            render("phi3", &m[1..]),
            "<|user|>\nHi <|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n<|assistant|>\n"
        );
        // Inline Jinja is taken as it is.
        assert_eq!(render("{{ messages[0]['content'] }}!", &m), "Be brief.!");
    }

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
