//! Chat templates: the Jinja template a model ships (`tokenizer.chat_template`, or a file given
//! with `--chat-template`) rendered with minijinja and its Python-compatibility methods, in a
//! sandbox: no I/O, a fuel limit on template work, and a cap on the output size.

#![warn(missing_docs)]

use minijinja::{context, Environment, Error as JinjaError, ErrorKind};
use tinynn_format::gguf::{Gguf, Key};

use crate::{ModelError, Result};

/// Template work allowed per render (minijinja fuel units); real templates need a few thousand.
const FUEL: u64 = 2_000_000;
/// Rendered prompts larger than this are refused.
const MAX_OUTPUT: usize = 16 << 20;

/// Templates known by name (llama.cpp's names for them): (name, Jinja source).
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

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant` (or whatever the template knows).
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: &str, content: &str) -> Message {
        Message {
            role: role.to_string(),
            content: content.to_string(),
        }
    }
}

/// A chat template (Jinja), rendered in a sandbox.
pub struct ChatTemplate {
    source: String,
    bos: String,
    eos: String,
}

fn template_err(e: JinjaError) -> ModelError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    ModelError::Invalid(format!("chat template: {}", msg.replace('\n', " ")))
}

impl ChatTemplate {
    /// A template from its source; `bos` and `eos` are the texts of the model's BOS/EOS tokens
    /// (templates refer to them as `bos_token` / `eos_token`).
    pub fn new(source: String, bos: &str, eos: &str) -> ChatTemplate {
        ChatTemplate {
            source,
            bos: bos.to_string(),
            eos: eos.to_string(),
        }
    }

    /// The Jinja source of the built-in template `name` (`chatml`, `llama3`, `gemma`, `phi3`),
    /// for models that ship none or a template the user wants to replace.
    pub fn built_in(name: &str) -> Option<&'static str> {
        BUILT_IN.iter().find(|(n, _)| *n == name).map(|(_, s)| *s)
    }

    /// The names [`ChatTemplate::built_in`] knows.
    pub fn built_in_names() -> Vec<&'static str> {
        BUILT_IN.iter().map(|(n, _)| *n).collect()
    }

    /// The template in a GGUF file, if it has one.
    pub fn from_gguf(g: &Gguf, bos: &str, eos: &str) -> Result<Option<ChatTemplate>> {
        Ok(g.get_str(Key::TokenizerChatTemplate)?
            .map(|s| ChatTemplate::new(s.to_string(), bos, eos)))
    }

    /// Renders `messages`, ending with the assistant's turn opener when `add_generation_prompt`.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        let mut env = Environment::new();
        env.set_fuel(Some(FUEL));
        env.set_recursion_limit(64);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template("chat", &self.source)
            .map_err(template_err)?;
        let tmpl = env.get_template("chat").map_err(template_err)?;
        let out = tmpl
            .render(context! {
                messages => messages.iter().map(|m| context! { role => m.role.clone(), content => m.content.clone() }).collect::<Vec<_>>(),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos.clone(),
                eos_token => self.eos.clone(),
            })
            .map_err(template_err)?;
        if out.len() > MAX_OUTPUT {
            return Err(ModelError::Invalid(format!(
                "chat template: output of {} bytes is too large",
                out.len()
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(name: &str, messages: &[Message]) -> String {
        let source = ChatTemplate::built_in(name).map_or(name.to_string(), str::to_string);
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
        // Any other text is a template of its own.
        assert_eq!(render("{{ messages[0]['content'] }}!", &m), "Be brief.!");
    }

    #[test]
    fn renders_python_style_templates_and_refuses_runaways() {
        let t = ChatTemplate::new(
            "{{ bos_token }}{% for m in messages %}[{{ m.role | upper }}] {{ m.content.strip() }}\n{% endfor %}{% if add_generation_prompt %}[ASSISTANT]{% endif %}".into(),
            "<s>",
            "</s>",
        );
        let out = t.render(&[Message::new("user", "  hi  ")], true).unwrap();
        assert_eq!(out, "<s>[USER] hi\n[ASSISTANT]");
        let loop_forever = ChatTemplate::new(
            "{% for i in range(100000000) %}x{% endfor %}".into(),
            "",
            "",
        );
        assert!(
            loop_forever.render(&[], false).is_err(),
            "fuel must stop it"
        );
        let raising = ChatTemplate::new(
            "{{ raise_exception('only user and assistant') }}".into(),
            "",
            "",
        );
        let err = raising.render(&[], false).err().unwrap().to_string();
        assert!(err.contains("only user and assistant"), "{err}");
    }
}
