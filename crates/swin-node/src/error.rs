//! HTTP errors: each case maps to a status and a JSON body
//! `{"error":{"code":"…","message":"…"}}` that never leaks internal details.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use swin_core::CoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    InvalidKey(String),
    #[error("{0}")]
    InvalidValue(String),
    #[error("namespace {0:?} is not configured")]
    UnknownNamespace(String),
    #[error("namespace {namespace:?} has no window size {window_size}")]
    UnknownWindowSize { namespace: String, window_size: u32 },
    #[error("no route for {0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    #[error("{0}")]
    Unavailable(String),
    #[error("internal error")]
    Internal,
}

impl ApiError {
    /// The same error about one item of a batch: its message starts with `at`.
    pub fn at(self, at: &str) -> ApiError {
        match self {
            ApiError::BadRequest(m) => ApiError::BadRequest(format!("{at}: {m}")),
            ApiError::InvalidKey(m) => ApiError::InvalidKey(format!("{at}: {m}")),
            ApiError::InvalidValue(m) => ApiError::InvalidValue(format!("{at}: {m}")),
            other => other,
        }
    }

    fn parts(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
            ApiError::InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid_key"),
            ApiError::InvalidValue(_) => (StatusCode::BAD_REQUEST, "invalid_value"),
            ApiError::UnknownNamespace(_) => (StatusCode::NOT_FOUND, "unknown_namespace"),
            ApiError::UnknownWindowSize { .. } => (StatusCode::BAD_REQUEST, "unknown_window_size"),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
            ApiError::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }
}

impl From<CoreError> for ApiError {
    fn from(e: CoreError) -> Self {
        match e {
            CoreError::NonFiniteValue(_) | CoreError::CountOutOfRange { .. } => {
                ApiError::InvalidValue(e.to_string())
            }
            CoreError::InvalidWindowSize { .. }
            | CoreError::InvalidCost { .. }
            | CoreError::InvalidLimit(_) => ApiError::BadRequest(e.to_string()),
            CoreError::UnknownWindowSize {
                namespace,
                window_size,
            } => ApiError::UnknownWindowSize {
                namespace,
                window_size,
            },
            CoreError::CapacityExceeded { .. } | CoreError::BucketsFull { .. } => {
                ApiError::Unavailable(e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.parts();
        let body = serde_json::json!({ "error": { "code": code, "message": self.to_string() } });
        (status, Json(body)).into_response()
    }
}
