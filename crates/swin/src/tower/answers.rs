//! How the tower layer answers: the RateLimit headers on a decided request, and the
//! refusals — denied, not decided, no key — as HTTP or as gRPC answers them.

use http::{HeaderValue, Request, Response, StatusCode};

use super::keys::{percent_escaped, NoKey};
use crate::decisions::Verdict;
use crate::error::Error;
use crate::policy::headers::write_headers;

pub(super) fn headers(h: &mut http::HeaderMap, v: &Verdict) {
    write_headers(h, &v.policies, &v.policy, &v.decision, v.shadow_denied);
}

pub(super) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"))
}

/// 429 (gRPC: RESOURCE_EXHAUSTED) with the verdict's headers.
pub(super) fn denied<R: Default>(v: &Verdict, grpc: bool) -> Response<R> {
    let message = match v.reason {
        Some(reason) => format!("rate limited: {reason}"),
        None => "rate limited".to_owned(),
    };
    let mut response = refusal(StatusCode::TOO_MANY_REQUESTS, grpc, 8, &message);
    headers(response.headers_mut(), v);
    response
}

/// A request that could not be decided, refused naming why: 400 (gRPC:
/// INVALID_ARGUMENT) when its key is one the limiter refuses, else 503 (UNAVAILABLE).
pub(super) fn undecided<R: Default>(e: &Error, grpc: bool) -> Response<R> {
    tracing::warn!(cause = %e, "a request the rate limit layer could not decide was refused");
    let message = format!("rate limit not decided: {e}");
    match e {
        Error::InvalidKey(_) | Error::InvalidValue(_) | Error::BadRequest(_) => {
            refusal(StatusCode::BAD_REQUEST, grpc, 3, &message)
        }
        _ => refusal(StatusCode::SERVICE_UNAVAILABLE, grpc, 14, &message),
    }
}

/// A request whose key could not be named, refused: 400 (gRPC: INVALID_ARGUMENT) for
/// what it carries, 500 (INTERNAL) when the server does not give what the key is read
/// from — logged with why; the client is told no more than that.
pub(super) fn no_key<R: Default>(e: &NoKey, grpc: bool) -> Response<R> {
    match e {
        NoKey::Invalid(why) => {
            tracing::warn!(cause = %why, "a request without a rate limit key was refused");
            let message = format!("rate limit not decided: {why}");
            refusal(StatusCode::BAD_REQUEST, grpc, 3, &message)
        }
        NoKey::NotServed(why) => {
            tracing::error!(cause = %why, "a request without a rate limit key was refused");
            let message = "rate limit not decided: internal error";
            refusal(StatusCode::INTERNAL_SERVER_ERROR, grpc, 13, message)
        }
    }
}

/// An empty answer of `status`; over gRPC, a trailers-only answer of `grpc_status`.
fn refusal<R: Default>(
    status: StatusCode,
    grpc: bool,
    grpc_status: u16,
    message: &str,
) -> Response<R> {
    let mut response = Response::new(R::default());
    match grpc {
        false => *response.status_mut() = status,
        true => {
            let h = response.headers_mut();
            h.insert(
                http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            h.insert("grpc-status", HeaderValue::from(grpc_status));
            if let Ok(m) = HeaderValue::from_str(&percent_escaped(message.as_bytes())) {
                h.insert("grpc-message", m);
            }
        }
    }
    response
}
