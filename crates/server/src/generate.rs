//! `/v1/chat/completions` and `/v1/completions`: a request becomes a `Job`
//! for the engine thread; its `Event`s become one JSON answer or an SSE
//! stream of OpenAI chunks ending in `data: [DONE]`. Dropping the event
//! receiver (a client gone, mid-stream or not) is how the engine learns to
//! cancel.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as Sse, Sse as SseBody};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, ChatRequest, CompletionRequest, Prompt, Sampling};
use crate::engine::{Event, Finish, GenParams, Job, Refused, TokenLogprob};
use crate::error::ApiError;
use crate::routes::{body, check_ids, AppState, St};

/// Which API the answer is shaped for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A seed for requests that give none: different per request, as OpenAI and llama-server do.
fn fresh_seed() -> u64 {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    t ^ NEXT_ID.fetch_add(1, Relaxed).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

pub async fn chat(State(st): St, b: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let req: ChatRequest = api::parse(&body(b)?)?;
        let (prompt, extra_stops) = st.format.tokens(&st.tokenizer, req.messages)?;
        let n = (req.logprobs == Some(true)).then(|| req.top_logprobs.unwrap_or(0).min(20) as usize);
        let mut params = req.sampling.params(n, fresh_seed())?;
        params.stop.extend(extra_stops);
        start(&st, Kind::Chat, prompt, params, &req.sampling).await
    };
    r.await.unwrap_or_else(|e| failed(&st, e))
}

pub async fn completions(State(st): St, b: Result<Bytes, BytesRejection>) -> Response {
    let r = async {
        let req: CompletionRequest = api::parse(&body(b)?)?;
        fn one<T>(mut v: Vec<T>) -> Result<T, ApiError> {
            match v.len() {
                1 => Ok(v.remove(0)),
                _ => Err(ApiError::bad_request("only one prompt per request is supported").param("prompt")),
            }
        }
        let prompt = match req.prompt {
            // As `tern run` encodes a prompt: with BOS, special tokens parsed.
            Prompt::Text(s) => st.tokenizer.encode(&s, true, true),
            Prompt::Texts(v) => st.tokenizer.encode(&one(v)?, true, true),
            Prompt::Tokens(ids) => ids,
            Prompt::TokenLists(v) => one(v)?,
        };
        check_ids(&prompt, st.info.n_vocab, "prompt")?;
        let n = req.logprobs.map(|n| n.min(20) as usize);
        let params = req.sampling.params(n, fresh_seed())?;
        start(&st, Kind::Completion, prompt, params, &req.sampling).await
    };
    r.await.unwrap_or_else(|e| failed(&st, e))
}

fn failed(st: &AppState, e: ApiError) -> Response {
    st.engine.shared.metrics.requests_failed.fetch_add(1, Relaxed);
    e.into_response()
}

/// Checks the prompt against the slot's context, queues the job, and answers.
async fn start(
    st: &Arc<AppState>,
    kind: Kind,
    prompt: Vec<u32>,
    params: GenParams,
    s: &Sampling,
) -> Result<Response, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty").param("prompt"));
    }
    if prompt.len() >= st.n_ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {} tokens, more than a slot's context of {} tokens holds (leave room for one generated token)",
            prompt.len(),
            st.n_ctx
        ))
        .param(if kind == Kind::Chat { "messages" } else { "prompt" }));
    }
    let logprobs = params.logprobs.is_some();
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job { prompt, params, events: tx, arrived: Instant::now() };
    st.engine.submit(job).map_err(|r| {
        let msg = match r {
            Refused::QueueFull => "every slot is busy and the queue is full; retry later",
            Refused::ShuttingDown => "the server is shutting down",
        };
        ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", msg)
    })?;
    st.engine.shared.metrics.requests.fetch_add(1, Relaxed);
    let ctx = Ctx {
        kind,
        id: format!("{}-{}", if kind == Kind::Chat { "chatcmpl" } else { "cmpl" }, NEXT_ID.fetch_add(1, Relaxed)),
        model: st.model_id.clone(),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        state: st.clone(),
        logprobs,
    };
    if s.stream() {
        Ok(ctx.stream(rx, s.include_usage()))
    } else {
        ctx.collect(rx).await
    }
}

/// What every chunk and answer of one request repeats.
struct Ctx {
    kind: Kind,
    id: String,
    model: String,
    created: u64,
    state: Arc<AppState>,
    logprobs: bool,
}

impl Ctx {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(chunk), "created": self.created, "model": self.model, "choices": choices})
    }

    /// OpenAI's usage, with the prompt tokens a slot's cache held in
    /// `prompt_tokens_details.cached_tokens`.
    fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
        json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}})
    }

    /// The log-probabilities in the API's shape: chat's `content` list, or
    /// the legacy completion lists (`text_offset` counted from `offset`).
    fn logprobs_json(&self, lps: &[TokenLogprob], offset: usize) -> Value {
        if !self.logprobs {
            return Value::Null;
        }
        let tok = &self.state.tokenizer;
        let piece = |id: u32| String::from_utf8_lossy(tok.token_piece(id, false)).into_owned();
        let top_map = |top: &[(u32, f32)]| -> serde_json::Map<String, Value> {
            top.iter().map(|&(id, lp)| (piece(id), json!(finite(lp)))).collect()
        };
        match self.kind {
            Kind::Chat => {
                let entry = |id: u32, lp: f32| json!({"token": piece(id), "logprob": finite(lp), "bytes": tok.token_piece(id, false)});
                let content: Vec<Value> = lps
                    .iter()
                    .map(|t| {
                        let mut e = entry(t.id, t.logprob);
                        e["top_logprobs"] = t.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
                        e
                    })
                    .collect();
                json!({ "content": content })
            }
            Kind::Completion => {
                let mut at = offset;
                let mut offsets = Vec::new();
                for t in lps {
                    offsets.push(at);
                    at += piece(t.id).len();
                }
                json!({
                    "tokens": lps.iter().map(|t| piece(t.id)).collect::<Vec<_>>(),
                    "token_logprobs": lps.iter().map(|t| finite(t.logprob)).collect::<Vec<_>>(),
                    "top_logprobs": lps.iter().map(|t| top_map(&t.top)).collect::<Vec<_>>(),
                    "text_offset": offsets,
                })
            }
        }
    }

    /// One choice: the whole message, or a chunk's delta.
    fn choice(&self, chunk: bool, text: Option<&str>, lps: Value, finish: Option<Finish>) -> Value {
        let finish = finish.map(Finish::as_str);
        match self.kind {
            Kind::Chat if chunk => {
                let delta = text.map_or(json!({}), |t| json!({"content": t}));
                json!([{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}])
            }
            Kind::Chat => json!([{
                "index": 0,
                "message": {"role": "assistant", "content": text.unwrap_or_default()},
                "logprobs": lps,
                "finish_reason": finish,
            }]),
            Kind::Completion => {
                json!([{"index": 0, "text": text.unwrap_or_default(), "logprobs": lps, "finish_reason": finish}])
            }
        }
    }

    async fn collect(self, mut rx: mpsc::UnboundedReceiver<Event>) -> Result<Response, ApiError> {
        let (mut text, mut lps) = (String::new(), Vec::new());
        while let Some(ev) = rx.recv().await {
            match ev {
                Event::Text { text: t, logprobs } => {
                    text += &t;
                    lps.extend(logprobs);
                }
                Event::Done { finish, prompt_tokens, completion_tokens, cached_tokens } => {
                    let lp = self.logprobs_json(&lps, 0);
                    let mut body = self.envelope(false, self.choice(false, Some(&text), lp, Some(finish)));
                    body["usage"] = Ctx::usage(prompt_tokens, completion_tokens, cached_tokens);
                    return Ok(Json(body).into_response());
                }
                Event::Failed(e) => return Err(engine_error(e)),
            }
        }
        Err(ApiError::server("the engine dropped the request"))
    }

    fn stream(self, rx: mpsc::UnboundedReceiver<Event>, include_usage: bool) -> Response {
        /// Where the stream is: the opening chunk (chat's role), events, the end.
        enum Stage {
            Open,
            Events,
            Usage(Value),
            Done,
            End,
        }
        let data = |v: Value| Ok::<_, Infallible>(Sse::default().data(v.to_string()));
        let state = (self, rx, Stage::Open, 0usize);
        let s = stream::unfold(state, move |(ctx, mut rx, stage, offset)| async move {
            match stage {
                Stage::Open if ctx.kind == Kind::Chat => {
                    let choices = json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]);
                    let ev = data(ctx.envelope(true, choices));
                    Some((ev, (ctx, rx, Stage::Events, offset)))
                }
                Stage::Open | Stage::Events => match rx.recv().await {
                    Some(Event::Text { text, logprobs }) => {
                        let lp = ctx.logprobs_json(&logprobs, offset);
                        let ev = data(ctx.envelope(true, ctx.choice(true, Some(&text), lp, None)));
                        let offset = offset + text.len();
                        Some((ev, (ctx, rx, Stage::Events, offset)))
                    }
                    Some(Event::Done { finish, prompt_tokens, completion_tokens, cached_tokens }) => {
                        let mut last = ctx.envelope(true, ctx.choice(true, None, Value::Null, Some(finish)));
                        if ctx.kind == Kind::Completion {
                            last["choices"][0]["text"] = json!("");
                        }
                        let next = match include_usage {
                            true => Stage::Usage(Ctx::usage(prompt_tokens, completion_tokens, cached_tokens)),
                            false => Stage::Done,
                        };
                        Some((data(last), (ctx, rx, next, offset)))
                    }
                    Some(Event::Failed(e)) => {
                        ctx.state.engine.shared.metrics.requests_failed.fetch_add(1, Relaxed);
                        Some((data(engine_error(e).body()), (ctx, rx, Stage::Done, offset)))
                    }
                    None => {
                        let e = ApiError::server("the engine dropped the request");
                        Some((data(e.body()), (ctx, rx, Stage::Done, offset)))
                    }
                },
                Stage::Usage(usage) => {
                    let mut v = ctx.envelope(true, json!([]));
                    v["usage"] = usage;
                    Some((data(v), (ctx, rx, Stage::Done, offset)))
                }
                Stage::Done => Some((Ok(Sse::default().data("[DONE]")), (ctx, rx, Stage::End, offset))),
                Stage::End => None,
            }
        });
        SseBody::new(s).into_response()
    }
}

/// An engine failure: 503 when shutting down, else 500.
fn engine_error(e: String) -> ApiError {
    if e.contains("shutting down") {
        ApiError::status(StatusCode::SERVICE_UNAVAILABLE, "unavailable_error", e)
    } else {
        ApiError::server(e)
    }
}

/// JSON has no -inf: a token the model rules out is reported at f32's lowest.
fn finite(x: f32) -> f32 {
    if x.is_finite() {
        x
    } else {
        f32::MIN
    }
}
