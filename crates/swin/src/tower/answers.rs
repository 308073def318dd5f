//! How the tower layer answers: the RateLimit headers on a decided request, and the
//! refusals — denied, not decided, no key — as HTTP or as gRPC answers them by default
//! ([`Refusals`]), or as the layer's error hook ([`OnRefused`]) answers them.

use http::{HeaderValue, Request, Response, StatusCode};

use super::keys::{percent_escaped, NoKey};
use crate::decisions::Verdict;
use crate::error::Error;
use crate::policy::headers::write_headers;

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

impl<R, F> OnRefused<R> for F
where
    F: Fn(Refused<'_>) -> Response<R>,
{
    fn answer(&self, why: Refused<'_>, _grpc: bool) -> Response<R> {
        self(why)
    }
}

/// The default answers: an empty 429 for a denial (gRPC: RESOURCE_EXHAUSTED); 400
/// (INVALID_ARGUMENT) for a key or cost the limiter refuses and for what a request
/// carries that names no key; 503 (UNAVAILABLE) for a store that failed; 500 (INTERNAL)
/// when the server does not give what the key is read from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Refusals;

impl<R: Default> OnRefused<R> for Refusals {
    fn answer(&self, why: Refused<'_>, grpc: bool) -> Response<R> {
        match why {
            Refused::Denied(v) => denied(v, grpc),
            Refused::Undecided(e) => undecided(e, grpc),
            Refused::NoKey(e) => no_key(e, grpc),
        }
    }
}

pub(super) fn headers(h: &mut http::HeaderMap, v: &Verdict) {
    write_headers(h, &v.policies, &v.policy, &v.decision, v.shadow_denied);
}

pub(super) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"))
}

/// 429 (gRPC: RESOURCE_EXHAUSTED); the layer adds the verdict's headers.
fn denied<R: Default>(v: &Verdict, grpc: bool) -> Response<R> {
    let message = match v.reason {
        Some(reason) => format!("rate limited: {reason}"),
        None => "rate limited".to_owned(),
    };
    refusal(StatusCode::TOO_MANY_REQUESTS, grpc, 8, &message)
}

/// A request that could not be decided, refused naming why: 400 (gRPC:
/// INVALID_ARGUMENT) when its key is one the limiter refuses, else 503 (UNAVAILABLE).
fn undecided<R: Default>(e: &Error, grpc: bool) -> Response<R> {
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
fn no_key<R: Default>(e: &NoKey, grpc: bool) -> Response<R> {
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
