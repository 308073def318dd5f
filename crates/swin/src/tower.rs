//! A tower layer that puts a [`Limiter`] in front of a service's routes (feature
//! `tower`): each request whose key function names a key is a hit of 1 on that key of
//! one namespace, decided as `POST /v1/namespaces/{namespace}/keys/{key}/hit` decides
//! it — across every node sharing the namespace's store.
//!
//! - A request whose key is `None` passes, unlimited.
//! - An allowed request reaches the inner service; its response carries `RateLimit` and
//!   `RateLimit-Policy` (and `swin-shadow-denied` when it passed only because what would
//!   deny it is in shadow).
//! - A denied one is answered 429 with `Retry-After` and those headers, and the inner
//!   service is not called. A gRPC request (`content-type: application/grpc…`) is
//!   answered as gRPC answers: status RESOURCE_EXHAUSTED, with the same headers.
//! - A store failure is decided as the namespace's `on_store_failure` says (an eventual
//!   namespace decides from what the node knows; a strict one that denies, denies); a
//!   request the limiter cannot decide at all is never let through: a key it refuses
//!   (empty, too long) is answered 400 (gRPC: INVALID_ARGUMENT), a store that failed where
//!   the namespace waits on it 503 (UNAVAILABLE).
//!
//! ```
//! # async fn run() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use axum::{routing::get, Router};
//! use swin::tower::RateLimitLayer;
//!
//! let config = swin::config::Config::from_toml(
//!     "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
//!      limits = [{ window_size = 60, limit = 100 }]\n",
//! )?;
//! let limiter = Arc::new(swin::Limiter::start(config).await?);
//! // each client address its own key; requests without one pass
//! let by_client = |r: &axum::http::Request<axum::body::Body>| {
//!     r.headers().get("x-client").and_then(|v| v.to_str().ok()).map(str::to_owned)
//! };
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter, "api", by_client));
//! # drop(app);
//! # Ok(())
//! # }
//! ```

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{HeaderValue, Request, Response, StatusCode};

use crate::decisions::Verdict;
use crate::error::Error;
use crate::policy::headers::write_headers;
use crate::Limiter;

/// Limits the requests of the services it wraps by a key of `namespace` (see the
/// module's documentation).
#[derive(Clone)]
pub struct RateLimitLayer<F> {
    limiter: Arc<Limiter>,
    namespace: Arc<str>,
    key: F,
}

impl<F> std::fmt::Debug for RateLimitLayer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<F> RateLimitLayer<F> {
    /// A layer deciding each request as a hit on `key(request)` of `namespace` in
    /// `limiter`; a request whose key is `None` passes.
    pub fn new(limiter: Arc<Limiter>, namespace: &str, key: F) -> Self {
        RateLimitLayer {
            limiter,
            namespace: namespace.into(),
            key,
        }
    }
}

impl<S, F: Clone> tower_layer::Layer<S> for RateLimitLayer<F> {
    type Service = RateLimit<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limiter: self.limiter.clone(),
            namespace: self.namespace.clone(),
            key: self.key.clone(),
        }
    }
}

/// A service behind a [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S, F> {
    inner: S,
    limiter: Arc<Limiter>,
    namespace: Arc<str>,
    key: F,
}

impl<S: std::fmt::Debug, F> std::fmt::Debug for RateLimit<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

type Answer<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, F, B, ResBody> tower_service::Service<Request<B>> for RateLimit<S, F>
where
    S: tower_service::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    F: Fn(&Request<B>) -> Option<String> + Clone + Send + Sync + 'static,
    B: Send + 'static,
    ResBody: Default + Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Answer<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // the service made ready is the one called; a clone is left for the next call
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let Some(key) = (self.key)(&request) else {
            return Box::pin(inner.call(request));
        };
        let (limiter, namespace) = (self.limiter.clone(), self.namespace.clone());
        Box::pin(async move {
            let grpc = is_grpc(&request);
            match limiter.hit(&namespace, &key, 1.0).await {
                Ok(v) if v.allowed() => {
                    let mut response = inner.call(request).await?;
                    headers(response.headers_mut(), &v);
                    Ok(response)
                }
                Ok(v) => Ok(denied(&v, grpc)),
                Err(e) => Ok(undecided(&e, grpc)),
            }
        })
    }
}

fn headers(h: &mut http::HeaderMap, v: &Verdict) {
    write_headers(h, &v.policies, &v.policy, &v.decision, v.shadow_denied);
}

fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|c| c.as_bytes().starts_with(b"application/grpc"))
}

/// 429 (gRPC: RESOURCE_EXHAUSTED) with the verdict's headers.
fn denied<R: Default>(v: &Verdict, grpc: bool) -> Response<R> {
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
            let encoded: String = message
                .bytes()
                .map(|b| match b {
                    b' '..=b'~' if b != b'%' => (b as char).to_string(),
                    _ => format!("%{b:02X}"),
                })
                .collect();
            if let Ok(m) = HeaderValue::from_str(&encoded) {
                h.insert("grpc-message", m);
            }
        }
    }
    response
}
