//! Extractors that turn what axum rejects into [`ApiError`]s with a JSON body: path
//! segments, and JSON bodies (an empty body is the type's default; a body must be a
//! JSON object and declared JSON).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::{header, HeaderMap};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::error::ApiError;
use crate::state::AppState;
use swin::error::Error;

/// `Path`, with a JSON 400 (not axum's plain text) for a segment that does not decode,
/// such as percent-encoded bytes that are not UTF-8.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        Ok(Self::decode(parts, state).await?)
    }
}

impl<T: serde::de::DeserializeOwned + Send> ApiPath<T> {
    async fn decode<S: Send + Sync>(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Error> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => {
                use axum::extract::path::ErrorKind;
                use axum::extract::rejection::PathRejection;
                // a key that is not UTF-8 is an invalid key, as the README says, on
                // every route that takes one
                if let PathRejection::FailedToDeserializePathParams(inner) = &e {
                    if let ErrorKind::InvalidUtf8InPathParam { key } = inner.kind() {
                        if key == "key" {
                            return Err(Error::InvalidKey(
                                "key must be UTF-8 (percent-decoded)".into(),
                            ));
                        }
                    }
                }
                Err(Error::BadRequest(format!("path: {}", e.body_text())))
            }
        }
    }
}

/// A JSON body parsed into `T` (its default when the body is empty).
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + Default> FromRequest<Arc<AppState>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let RawJson(bytes) = RawJson::from_request(req, state).await?;
        Ok(JsonBody(parse_json(bytes.as_ref())?))
    }
}

/// A JSON body left as bytes, for a caller that borrows strings from it (a batch of a
/// thousand items should not cost two thousand allocations); `None` when empty.
#[derive(Debug)]
pub struct RawJson(pub Option<Bytes>);

impl FromRequest<Arc<AppState>> for RawJson {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        Self::read(req, state).await
    }
}

impl RawJson {
    /// Reads `req`'s body within the node's limits (size, time) and checks it is JSON.
    pub(super) async fn read(req: Request, state: &Arc<AppState>) -> Result<Self, ApiError> {
        let headers = req.headers();
        // a declared length over the limit is refused before a byte is read
        let declared = headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > state.body_limit as u64) {
            return Err(ApiError::PayloadTooLarge(state.body_limit));
        }
        // a request that says it has no body (no length, or 0) has nothing to read
        if axum::body::HttpBody::is_end_stream(req.body()) {
            return Ok(RawJson(None));
        }
        let is_json = declared_json(headers);
        // read within the limit here (no DefaultBodyLimit layer: a request extension less)
        let read = axum::body::to_bytes(req.into_body(), state.body_limit);
        let body = tokio::time::timeout(state.body_timeout, read)
            .await
            .map_err(|_| ApiError::BodyTimeout(state.body_timeout))?;
        Ok(RawJson(json_bytes(is_json, body, state.body_limit)?))
    }
}

/// Whether the request declares a JSON body (`application/json`, `application/…+json`).
fn declared_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            let m = m.trim().to_ascii_lowercase();
            m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
        })
}

/// The body of a POST: `None` when empty, else it must be declared JSON.
fn json_bytes(
    is_json: bool,
    body: Result<Bytes, axum::Error>,
    limit: usize,
) -> Result<Option<Bytes>, ApiError> {
    let body = body.map_err(|e| match past_limit(&e) {
        true => ApiError::PayloadTooLarge(limit),
        false => Error::BadRequest(format!("failed to read the request body: {e}")).into(),
    })?;
    if body.is_empty() {
        return Ok(None);
    }
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    Ok(Some(body))
}

/// Whether reading a body failed because it went past the limit.
fn past_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

pub(crate) fn parse_json<'a, T: Deserialize<'a> + Default>(
    body: Option<&'a Bytes>,
) -> Result<T, Error> {
    match body {
        None => Ok(T::default()),
        // serde would also take a struct as an array of its fields (`[1, 60]`): bodies
        // are objects, so such a body is malformed, not a shorthand
        Some(b) if b.trim_ascii_start().first() != Some(&b'{') => Err(Error::BadRequest(
            "malformed JSON body: must be a JSON object".into(),
        )),
        // parsed as before; only a body that fails is parsed again to name the field it
        // got wrong, so well-formed requests pay nothing for the message
        Some(b) => serde_json::from_slice(b).map_err(|e| {
            let mut de = serde_json::Deserializer::from_slice(b);
            let path = match serde_path_to_error::deserialize::<_, T>(&mut de) {
                Err(e) => e.path().to_string(),
                Ok(_) => String::new(),
            };
            if path.is_empty() || path == "." {
                Error::BadRequest(format!("malformed JSON body: {e}"))
            } else {
                Error::BadRequest(format!("malformed JSON body: {path}: {e}"))
            }
        }),
    }
}
