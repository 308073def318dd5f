//! HTTP errors: each [`Error`] maps to a status and a JSON body
//! `{"error":{"code":"…","message":"…"}}` that never leaks internal details; a handler
//! answers an [`ApiError`], which any [`Error`] becomes with `?`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use swin::error::Error;

/// The status and the machine-readable code of an error.
fn status_and_code(e: &Error) -> (StatusCode, &'static str) {
    match e {
        Error::BadRequest(_) => (StatusCode::BAD_REQUEST, "bad_request"),
        Error::InvalidKey(_) => (StatusCode::BAD_REQUEST, "invalid_key"),
        Error::InvalidValue(_) => (StatusCode::BAD_REQUEST, "invalid_value"),
        Error::UnknownNamespace(_) => (StatusCode::NOT_FOUND, "unknown_namespace"),
        Error::UnknownWindowSize { .. } => (StatusCode::BAD_REQUEST, "unknown_window_size"),
        Error::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
        Error::UnknownLease(_) => (StatusCode::NOT_FOUND, "unknown_lease"),
        Error::UnknownReservation(_) => (StatusCode::NOT_FOUND, "unknown_reservation"),
        Error::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
        Error::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
        Error::UnsupportedMediaType => {
            (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
        }
        Error::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
        Error::Exhausted(_) => (StatusCode::TOO_MANY_REQUESTS, "exhausted"),
        Error::Store { reason, .. } => (StatusCode::SERVICE_UNAVAILABLE, reason),
        Error::UriTooLong(_) => (StatusCode::URI_TOO_LONG, "uri_too_long"),
        Error::HeadersTooLarge(_) => (
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
        ),
        Error::BodyTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
        Error::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
        Error::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
        Error::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
    }
}

/// An [`Error`] as an HTTP answer.
#[derive(Debug)]
pub struct ApiError(pub Error);

impl<E: Into<Error>> From<E> for ApiError {
    fn from(e: E) -> Self {
        ApiError(e.into())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = status_and_code(&self.0);
        let body = serde_json::json!({ "error": { "code": code, "message": self.0.to_string() } });
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
