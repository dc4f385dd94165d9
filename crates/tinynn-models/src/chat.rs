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
