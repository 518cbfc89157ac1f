//! Errors: the library's typed `Error`, and `ApiError`, an HTTP status with
//! OpenAI's error object (`{"error": {"message", "type", "param", "code"}}`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("loading the model: {0}")]
    Load(String),
    #[error("listening on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("the HTTP runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the chat template: {0}")]
    Template(#[from] tern_tokenizer::TemplateError),
    #[error("{0}")]
    Engine(String),
}

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    pub fn param(mut self, param: &'static str) -> ApiError {
        self.param = Some(param);
        self
    }

    pub fn status(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::status(StatusCode::UNAUTHORIZED, "authentication_error", "invalid or missing API key")
        }
    }

    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError::status(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The body, also sent as the last event of a stream that fails.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            // Slots free up within a request's time; a second is a fair first wait.
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
