//! Request bodies, as serde types. Unknown fields are ignored (serde's
//! default), as llama-server does; a wrong type is a 400 naming it.

use serde::Deserialize;
use tern_sampling::SamplerConfig;

use crate::engine::GenParams;
use crate::error::ApiError;

/// One string or several (`stop`, a completion's `prompt`).
#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    pub fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A message's content: a string, or OpenAI's list of parts (text parts only).
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize, Debug)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl Content {
    pub fn text(self) -> Result<String, ApiError> {
        match self {
            Content::Text(s) => Ok(s),
            Content::Parts(parts) => parts
                .into_iter()
                .map(|p| match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => Ok(t),
                    (kind, _) => {
                        Err(ApiError::bad_request(format!("content parts of type {kind:?} are not supported"))
                            .param("messages"))
                    }
                })
                .collect(),
        }
    }
}

#[derive(Deserialize, Debug)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Deserialize, Debug, Default)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// The sampling and length fields chat and completions share.
#[derive(Deserialize, Debug, Default)]
pub struct Sampling {
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    /// llama-server's name for the same.
    pub n_predict: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    /// Any integer: a negative one is taken as its two's-complement bits.
    pub seed: Option<i64>,
    pub stop: Option<OneOrMany<String>>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repeat_penalty: Option<f32>,
    pub repeat_last_n: Option<u32>,
    pub n: Option<u32>,
    /// llama-server's prompt reuse: on unless `false`.
    pub cache_prompt: Option<bool>,
    /// llama-server's: generate past end-of-generation tokens (they are
    /// never sampled), until `max_tokens` or the context's end.
    pub ignore_eos: Option<bool>,
    /// Options are `Option`s throughout: clients send `null` for "not given".
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
}

impl Sampling {
    /// The generation parameters; `logprobs` is the number of alternatives
    /// to report per token when log-probabilities are asked for.
    pub fn params(&self, logprobs: Option<usize>, default_seed: u64) -> Result<GenParams, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request("only n = 1 is supported").param("n"));
        }
        let range = |v: Option<f32>, name: &'static str, lo: f32, hi: f32| match v {
            Some(x) if !(lo..=hi).contains(&x) => {
                Err(ApiError::bad_request(format!("{name} must be between {lo} and {hi}")).param(name))
            }
            _ => Ok(()),
        };
        range(self.temperature, "temperature", 0.0, 100.0)?;
        range(self.top_p, "top_p", 0.0, 1.0)?;
        range(self.min_p, "min_p", 0.0, 1.0)?;
        range(self.presence_penalty, "presence_penalty", -2.0, 2.0)?;
        range(self.frequency_penalty, "frequency_penalty", -2.0, 2.0)?;
        range(self.repeat_penalty, "repeat_penalty", 0.0, 100.0)?;
        let d = SamplerConfig::default();
        let sampler = SamplerConfig {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map_or(d.top_k, |k| k as usize),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repeat_penalty: self.repeat_penalty.unwrap_or(d.repeat_penalty),
            repeat_last_n: self.repeat_last_n.map_or(d.repeat_last_n, |n| n as usize),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            seed: self.seed.map_or(default_seed, |s| s as u64),
        };
        let max_tokens = self
            .max_completion_tokens
            .or(self.max_tokens)
            .or(self.n_predict.and_then(|n| u64::try_from(n).ok()))
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let stop = self.stop.clone().map(OneOrMany::into_vec).unwrap_or_default();
        let (cache_prompt, ignore_eos) = (self.cache_prompt != Some(false), self.ignore_eos == Some(true));
        Ok(GenParams { sampler, max_tokens, stop, logprobs, cache_prompt, ignore_eos })
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage == Some(true))
    }

    pub fn stream(&self) -> bool {
        self.stream == Some(true)
    }
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// A completion prompt: text, token ids, or a list of one of either.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// The legacy API's count of alternatives per token.
    pub logprobs: Option<u32>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Deserialize, Debug)]
pub struct TokenizeRequest {
    pub content: String,
    pub add_special: Option<bool>,
    pub with_pieces: Option<bool>,
}

#[derive(Deserialize, Debug)]
pub struct DetokenizeRequest {
    pub tokens: Vec<u32>,
}

/// The body as `T`: malformed JSON and wrong types are a 400 that says where.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampling(v: &str) -> Sampling {
        parse(v.as_bytes()).unwrap_or_else(|e| panic!("{v}: {}", e.message))
    }

    #[test]
    fn lengths_and_defaults() {
        let p = sampling(r#"{"max_tokens": 5, "max_completion_tokens": 7}"#).params(None, 9).ok().unwrap();
        assert_eq!(p.max_tokens, Some(7), "the newer name wins");
        assert_eq!(p.sampler.seed, 9);
        assert_eq!(p.sampler.temperature, SamplerConfig::default().temperature);
        let p = sampling(r#"{"n_predict": -1, "seed": -1, "stop": "x"}"#).params(None, 0).ok().unwrap();
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.sampler.seed, u64::MAX);
        assert_eq!(p.stop, ["x"]);
        let e = sampling(r#"{"top_p": 2}"#).params(None, 0).err().unwrap();
        assert_eq!(e.param, Some("top_p"));
    }

    #[test]
    fn prompts_of_every_shape() {
        let p = |s: &str| parse::<CompletionRequest>(s.as_bytes()).map(|r| r.prompt);
        assert!(matches!(p(r#"{"prompt": "a"}"#), Ok(Prompt::Text(_))));
        assert!(matches!(p(r#"{"prompt": [1, 2]}"#), Ok(Prompt::Tokens(_))));
        assert!(matches!(p(r#"{"prompt": ["a"]}"#), Ok(Prompt::Texts(_))));
        assert!(matches!(p(r#"{"prompt": [[1]]}"#), Ok(Prompt::TokenLists(_))));
        assert!(p(r#"{"prompt": [-1]}"#).is_err());
        assert!(p(r#"{}"#).is_err());
    }
}
