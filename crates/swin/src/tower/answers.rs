//! How the tower layer answers: the RateLimit headers on a decided request, and the
//! refusals — denied, not decided, no key — as HTTP or as gRPC answers them by default
//! ([`Refusals`]), or as the layer's error hook ([`OnRefused`]) answers them.

use http::{HeaderValue, Request, Response, StatusCode};

use super::keys::{percent_escaped, NoKey};
use crate::decisions::Verdict;
use crate::error::Error;

/// Why the layer answered a request itself, without the inner service.
#[derive(Debug)]
#[non_exhaustive]
pub enum Refused<'a> {
    /// Over its limit (the layer adds the decision's headers, `Retry-After` among them,
    /// to the answer).
    Denied(&'a Verdict),
    /// The limiter could not decide it: a key it refuses (empty, too long), a cost it
    /// refuses, a store that failed where the namespace waits on it.
    Undecided(&'a Error),
    /// Its key could not be named ([`NoKey`]).
    NoKey(&'a NoKey),
}

/// Answers a refused request: the layer's error hook. A closure
/// `Fn(Refused<'_>) -> Response<R>` is one; [`Refusals`] is the default.
pub trait OnRefused<R> {
    /// The answer to a request refused for `why`; `grpc` when it came over gRPC.
    fn answer(&self, why: Refused<'_>, grpc: bool) -> Response<R>;
}

/// A closure's answer, as it wrote it; to a gRPC request whose answer the closure gave
/// no `grpc-status`, the layer makes it a gRPC refusal (HTTP 200, `application/grpc`, the
/// status [`Refusals`] would give): a gRPC client reads an HTTP 429 as UNAVAILABLE, and
/// would retry what is over its limit.
impl<R, F> OnRefused<R> for F
where
    F: Fn(Refused<'_>) -> Response<R>,
{
    fn answer(&self, why: Refused<'_>, grpc: bool) -> Response<R> {
        let code = grpc.then(|| judged(&why).1);
        let mut response = self(why);
        if let Some(code) = code {
            if !response.headers().contains_key("grpc-status") {
                *response.status_mut() = StatusCode::OK;
                let h = response.headers_mut();
                h.insert(
                    http::header::CONTENT_TYPE,
                    HeaderValue::from_static("application/grpc"),
                );
                h.insert("grpc-status", HeaderValue::from(code));
            }
        }
        response
    }
}

/// The default answers: an empty 429 for a denial (gRPC: RESOURCE_EXHAUSTED); 400
/// (INVALID_ARGUMENT) for a key or cost the limiter refuses and for what a request
/// carries or lacks that names no key; 503 (UNAVAILABLE) for a store that failed; 500
/// (INTERNAL) when the server does not give what the key is read from, or the namespace
/// is no longer served.
#[derive(Debug, Clone, Copy, Default)]
pub struct Refusals;

impl<R: Default> OnRefused<R> for Refusals {
    fn answer(&self, why: Refused<'_>, grpc: bool) -> Response<R> {
        let (status, grpc_status, message) = judged(&why);
        log(&why);
        refusal(status, grpc, grpc_status, &message)
    }
}

/// How a refusal is answered by default: its HTTP status, its gRPC status and what the
/// client is told. A denial is 429 (RESOURCE_EXHAUSTED); a request the limiter could
/// not decide, 400 (INVALID_ARGUMENT) when its key or cost is one the limiter refuses,
/// 500 (INTERNAL) when the namespace is no longer served (a reload removed it: the
/// server's doing, not the client's), else 503 (UNAVAILABLE); one without a key, 400 for
/// what it carries or lacks, 500 when the server does not give what the key is read from
/// (the client is told no more than that).
fn judged(why: &Refused<'_>) -> (StatusCode, u16, String) {
    match why {
        Refused::Denied(v) => {
            let message = match v.reason {
                Some(reason) => format!("rate limited: {reason}"),
                None => "rate limited".to_owned(),
            };
            (StatusCode::TOO_MANY_REQUESTS, 8, message)
        }
        Refused::Undecided(e) => {
            let message = format!("rate limit not decided: {e}");
            match e {
                Error::InvalidKey(_) | Error::InvalidValue(_) | Error::BadRequest(_) => {
                    (StatusCode::BAD_REQUEST, 3, message)
                }
                Error::UnknownNamespace(_) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    13,
                    "rate limit not decided: internal error".to_owned(),
                ),
                _ => (StatusCode::SERVICE_UNAVAILABLE, 14, message),
            }
        }
        Refused::NoKey(NoKey::NotServed(_)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            13,
            "rate limit not decided: internal error".to_owned(),
        ),
        Refused::NoKey(e) => (
            StatusCode::BAD_REQUEST,
            3,
            format!("rate limit not decided: {e}"),
        ),
    }
}

/// Logs a refusal the server should hear of, at the level its cause deserves.
fn log(why: &Refused<'_>) {
    match why {
        Refused::Denied(_) => {}
        Refused::Undecided(e @ Error::UnknownNamespace(_)) => {
            tracing::error!(cause = %e, "the rate limit layer's namespace is not served (a reload removed it?): requests are refused");
        }
        Refused::Undecided(e) => {
            tracing::warn!(cause = %e, "a request the rate limit layer could not decide was refused");
        }
        Refused::NoKey(NoKey::NotServed(why)) => {
            tracing::error!(cause = %why, "a request without a rate limit key was refused");
        }
        Refused::NoKey(e) => {
            tracing::warn!(cause = %e, "a request without a rate limit key was refused");
        }
    }
}

pub(super) fn headers(h: &mut http::HeaderMap, v: &Verdict) {
    crate::policy::headers::write_to(h, v.headers());
}

pub(super) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"))
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
