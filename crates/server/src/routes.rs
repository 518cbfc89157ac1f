//! The router: authentication, the body limit, and the endpoints that do
//! not generate (models, health, metrics, tokenize, detokenize).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tern_tokenizer::Tokenizer;

use crate::api::{self, DetokenizeRequest, TokenizeRequest};
use crate::engine::{EngineHandle, ModelInfo};
use crate::error::ApiError;
use crate::generate;
use crate::prompt::ChatFormat;

/// What every handler shares. The session is not here: only the engine thread has it.
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub format: ChatFormat,
    pub model_id: String,
    pub info: ModelInfo,
    /// A slot's context in tokens.
    pub n_ctx: usize,
    pub api_key: Option<String>,
    pub created: u64,
}

pub type St = State<Arc<AppState>>;

pub fn router(state: Arc<AppState>, body_limit: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/completions", post(generate::completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

/// With `--api-key`, every endpoint but `/health` wants `Authorization: Bearer KEY`.
async fn auth(State(st): St, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let path = req.uri().path();
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let ok = given.and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|g| g.trim() == key);
        if !ok && path != "/health" && path != "/v1/health" {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The request body, or the error its reading gave (413 past the limit).
pub fn body(b: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    b.map_err(|r| {
        let status = r.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server accepts".to_string()
        } else {
            r.body_text()
        };
        ApiError::status(status, "invalid_request_error", message)
    })
}

async fn not_found() -> ApiError {
    ApiError::status(StatusCode::NOT_FOUND, "not_found_error", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::status(StatusCode::METHOD_NOT_ALLOWED, "invalid_request_error", "method not allowed on this endpoint")
}

async fn models(State(st): St) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.model_id,
            "object": "model",
            "created": st.created,
            "owned_by": "tern",
            "meta": {
                "n_ctx_train": st.info.n_ctx_train,
                "n_ctx_slot": st.n_ctx,
                "n_vocab": st.info.n_vocab,
                "n_slots": st.engine.shared.n_slots,
                "chat_template": st.info.chat_template.is_some(),
            },
        }],
    }))
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({"status": "ok"}))
}

async fn metrics(State(st): St) -> impl IntoResponse {
    let text = st.engine.shared.metrics.render(&st.engine.shared.gauges());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text)
}

async fn tokenize(State(st): St, b: Result<Bytes, BytesRejection>) -> Result<Json<serde_json::Value>, ApiError> {
    let req: TokenizeRequest = api::parse(&body(b)?)?;
    let ids = st.tokenizer.encode(&req.content, req.add_special == Some(true), true);
    if req.with_pieces != Some(true) {
        return Ok(Json(json!({ "tokens": ids })));
    }
    let pieces: Vec<_> = ids
        .iter()
        .map(|&id| {
            let bytes = st.tokenizer.token_piece(id, true);
            match std::str::from_utf8(bytes) {
                Ok(s) => json!({"id": id, "piece": s}),
                Err(_) => json!({"id": id, "piece": bytes}),
            }
        })
        .collect();
    Ok(Json(json!({ "tokens": pieces })))
}

async fn detokenize(State(st): St, b: Result<Bytes, BytesRejection>) -> Result<Json<serde_json::Value>, ApiError> {
    let req: DetokenizeRequest = api::parse(&body(b)?)?;
    check_ids(&req.tokens, st.tokenizer.n_vocab(), "tokens")?;
    Ok(Json(json!({ "content": st.tokenizer.decode(&req.tokens) })))
}

/// Token ids past the vocabulary are the client's mistake, not a panic.
pub fn check_ids(ids: &[u32], n_vocab: usize, param: &'static str) -> Result<(), ApiError> {
    match ids.iter().find(|&&id| id as usize >= n_vocab) {
        Some(id) => {
            Err(ApiError::bad_request(format!("token id {id} is outside the vocabulary ({n_vocab})")).param(param))
        }
        None => Ok(()),
    }
}
