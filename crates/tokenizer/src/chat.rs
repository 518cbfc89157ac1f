//! Chat templates: the Jinja template a GGUF carries in
//! `tokenizer.chat_template`, rendered with minijinja.

use minijinja::{context, Environment, Error as JinjaError, Value};
use tern_gguf::Metadata;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: &str) -> Message {
        Message { role: role.to_string(), content: content.to_string() }
    }
}

/// A compiled chat template plus the special-token texts it may reference.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
}

#[derive(Debug, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(String);

impl From<JinjaError> for TemplateError {
    fn from(e: JinjaError) -> TemplateError {
        TemplateError(e.to_string())
    }
}

const KEY_TEMPLATE: &str = "tokenizer.chat_template";

/// Instructions one render may run.
const TEMPLATE_FUEL: u64 = 20_000_000;

impl ChatTemplate {
    /// The model's template, `Ok(None)` when it has none.
    pub fn from_metadata(md: &Metadata, bos: &str, eos: &str) -> Result<Option<ChatTemplate>, TemplateError> {
        let Some(src) = md.get(KEY_TEMPLATE).and_then(|v| v.as_str()) else { return Ok(None) };
        ChatTemplate::new(src, bos, eos).map(Some)
    }

    pub fn new(src: &str, bos: &str, eos: &str) -> Result<ChatTemplate, TemplateError> {
        let mut env = Environment::new();
        crate::jinja::install(&mut env);
        // A template comes from a file: a loop that never ends (or nests
        // ranges without bound) stops with an error instead of hanging.
        // Real templates spend a few hundred instructions a message.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.add_template_owned("chat", src.to_string())?;
        Ok(ChatTemplate { env, bos: bos.to_string(), eos: eos.to_string() })
    }

    /// The prompt for `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, TemplateError> {
        let msgs: Vec<Value> =
            messages.iter().map(|m| context! { role => m.role.clone(), content => m.content.clone() }).collect();
        let t = self.env.get_template("chat")?;
        Ok(t.render(context! {
            messages => msgs,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of Llama 3's template (BitNet 2B-4T uses a variant of it).
    const LLAMA3: &str = "{% for m in messages %}{% if loop.first %}{{ bos_token }}{% endif %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";

    #[test]
    fn renders_a_conversation() {
        let t = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|end_of_text|>").unwrap();
        let out = t.render(&[Message::new("user", " Hi ")], true).unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        );
    }

    #[test]
    fn python_methods_and_errors() {
        let t = ChatTemplate::new("{{ messages[0].content.strip().upper() }}{% if messages|length > 1 %}{{ raise_exception('one only') }}{% endif %}", "", "").unwrap();
        assert_eq!(t.render(&[Message::new("user", "  a b ")], false).unwrap(), "A B");
        let err = t.render(&[Message::new("user", "a"), Message::new("user", "b")], false).unwrap_err();
        assert!(err.to_string().contains("one only"), "{err}");
        assert!(ChatTemplate::new("{% if %}", "", "").is_err());
    }

    /// A template that would loop for ever (nested ranges, 10^15 steps) is an
    /// error, and a long real conversation is not.
    #[test]
    fn endless_templates_run_out_of_fuel() {
        let t = ChatTemplate::new("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}", "", "").unwrap();
        assert!(t.render(&[], false).is_err());
        let qwen3 = include_str!("../../../testdata/templates/Qwen-Qwen3-0.6B.jinja");
        let t = ChatTemplate::new(qwen3, "", "").unwrap();
        let talk: Vec<Message> =
            (0..2000).map(|i| Message::new(["user", "assistant"][i % 2], "some words here")).collect();
        assert!(t.render(&talk, true).is_ok());
    }
}
