//! Chat messages to prompt text: the model's GGUF chat template when it has
//! one; otherwise a plain transcript (README, `tern serve`):
//!
//! ```text
//! System: {content}
//! User: {content}
//! Assistant: {content}
//! ...
//! Assistant:
//! ```
//!
//! one line per message, the role capitalised, then `Assistant:` for the
//! model to continue. Transcript answers also stop at `"\nUser:"`, where a
//! base model would start writing the user's next turn.

use tern_tokenizer::{ChatTemplate, Message, Tokenizer};

use crate::api::ChatMessage;
use crate::error::ApiError;

/// The stop string a transcript adds.
pub const TRANSCRIPT_STOP: &str = "\nUser:";

pub enum ChatFormat {
    Template(Box<ChatTemplate>),
    Transcript,
}

impl ChatFormat {
    /// The prompt's tokens, and the stop strings the format adds.
    pub fn tokens(&self, tok: &Tokenizer, messages: Vec<ChatMessage>) -> Result<(Vec<u32>, Vec<String>), ApiError> {
        if messages.is_empty() {
            return Err(ApiError::bad_request("messages is empty").param("messages"));
        }
        let mut msgs = Vec::with_capacity(messages.len());
        for m in messages {
            let content = m.content.map(|c| c.text()).transpose()?.unwrap_or_default();
            msgs.push(Message::new(&m.role, &content));
        }
        match self {
            ChatFormat::Template(t) => {
                let text = t.render(&msgs, true).map_err(|e| ApiError::bad_request(e.to_string()).param("messages"))?;
                // The template writes the BOS and special tokens itself.
                Ok((tok.encode(&text, false, true), Vec::new()))
            }
            ChatFormat::Transcript => Ok((tok.encode(&transcript(&msgs), true, false), vec![TRANSCRIPT_STOP.into()])),
        }
    }
}

pub fn transcript(msgs: &[Message]) -> String {
    let mut out = String::new();
    for m in msgs {
        let mut role = m.role.clone();
        if let Some(first) = role.get_mut(0..1) {
            first.make_ascii_uppercase();
        }
        out += &format!("{role}: {}\n", m.content);
    }
    out + "Assistant:"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transcript_format() {
        let msgs = [Message::new("system", "Be brief."), Message::new("user", "Who?"), Message::new("ünï", "x")];
        assert_eq!(
            transcript(&msgs),
            "System: Be brief.\nUser: Who?\nünï: x\nAssistant:",
            "a role starting with a non-ASCII letter stays as given"
        );
    }
}
