//! HTTP errors: what the library answered ([`Error`]) and what the HTTP door refuses on
//! its own (a route, a method, a body, a head, a token), each mapped to a status and a
//! JSON body `{"error":{"code":"…","message":"…"}}` that never leaks internal details.
//! A handler answers an [`ApiError`], which any [`Error`] becomes with `?`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use swin::error::Error;

/// The longest request URI served (414 past it, with a JSON error).
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// The most header bytes (names and values) of one request (431 past it, JSON error).
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// Why an HTTP request was not answered as asked.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// What the library refused or could not do.
    #[error(transparent)]
    Limiter(Error),
    /// Nothing is served at that path.
    #[error("no route for {0}")]
    NotFound(String),
    /// The path is served, not with that method.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A body past `body_limit` (bytes).
    #[error("body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// A body that is not declared JSON.
    #[error("body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// A request URI past [`MAX_URI_BYTES`] (its length).
    #[error("the request URI is {0} bytes; the limit is {MAX_URI_BYTES}")]
    UriTooLong(usize),
    /// Request headers past [`MAX_HEADER_BYTES`] (their length).
    #[error("the request headers are {0} bytes; the limit is {MAX_HEADER_BYTES}")]
    HeadersTooLarge(usize),
    /// A body that did not arrive within `body_timeout`.
    #[error("the body did not arrive within {0:?}")]
    BodyTimeout(std::time::Duration),
    /// No token, or one the node does not know: 401 with `WWW-Authenticate: Bearer`.
    #[error("{0}")]
    Unauthorized(String),
    /// A known token without the route's scope.
    #[error("{0}")]
    Forbidden(String),
}

impl<E: Into<Error>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError::Limiter(e.into())
    }
}

impl ApiError {
    /// The status and the machine-readable code.
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Limiter(e) => limiter_status_and_code(e),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::UriTooLong(_) => (StatusCode::URI_TOO_LONG, "uri_too_long"),
            ApiError::HeadersTooLarge(_) => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "headers_too_large",
            ),
            ApiError::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
        }
    }
}

/// The status and the machine-readable code of what the library answered.
fn limiter_status_and_code(e: &Error) -> (StatusCode, &'static str) {
    match e {
        Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        Error::InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid_key"),
        Error::InvalidValue(_) => (StatusCode::BAD_REQUEST, "invalid_value"),
        Error::UnknownNamespace(_) => (StatusCode::NOT_FOUND, "unknown_namespace"),
        Error::UnknownWindowSize(_) => (StatusCode::BAD_REQUEST, "unknown_window_size"),
        Error::UnknownLease(_) => (StatusCode::NOT_FOUND, "unknown_lease"),
        Error::UnknownReservation(_) => (StatusCode::NOT_FOUND, "unknown_reservation"),
        Error::AlreadyCommitted(_) => (StatusCode::CONFLICT, "already_committed"),
        Error::OutcomeUnknown(_) => (StatusCode::SERVICE_UNAVAILABLE, "outcome_unknown"),
        Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Error::Exhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "exhausted"),
        Error::Store { reason, .. } => (StatusCode::SERVICE_UNAVAILABLE, reason),
        Error::IdempotencyKeyReused(_) => {
            (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
        }
        Error::IdempotencyInProgress(_) => (StatusCode::CONFLICT, "idempotency_in_progress"),
        Error::IdempotencyFull(_) => (StatusCode::SERVICE_UNAVAILABLE, "idempotency_full"),
        Error::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let body = serde_json::json!({ "error": { "code": code, "message": self.to_string() } });
        let mut resp = (status, Json(body)).into_response();
        if status == StatusCode::UNAUTHORIZED {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}
