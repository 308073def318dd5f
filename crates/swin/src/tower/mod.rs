//! A tower layer that puts a [`Limiter`] in front of a service's routes (feature
//! `tower`): each request whose [`KeyExtractor`] names a key is a hit of 1 on that key of
//! one namespace, decided as `POST /v1/namespaces/{namespace}/keys/{key}/hit` decides
//! it — across every node sharing the namespace's store.
//!
//! - The key: [`ClientAddr`] (the client's address behind the proxies you trust, as the
//!   daemon decides it), [`PeerAddr`] (the connection's peer), [`HeaderKey`] (all the
//!   bytes of a header, for a header a layer in front has authenticated), or a closure
//!   `Fn(&Request<B>) -> Option<String>`.
//! - A request whose key is `None` passes, unlimited: that is the service's explicit
//!   choice (a closure's `None`, [`HeaderKey`] when the header is absent), so a key
//!   function returns it only for requests meant to be unlimited — never for a value it
//!   cannot read (`to_str().ok()` lets every client that sends a byte past ASCII through).
//! - An allowed request reaches the inner service; its response carries `RateLimit` and
//!   `RateLimit-Policy` (and `swin-shadow-denied` when it passed only because what would
//!   deny it is in shadow).
//! - A denied one is answered 429 with `Retry-After` and those headers, and the inner
//!   service is not called. A gRPC request (`content-type: application/grpc…`) is
//!   answered as gRPC answers: status RESOURCE_EXHAUSTED, with the same headers.
//! - A store failure is decided as the namespace's `on_store_failure` says (an eventual
//!   namespace decides from what the node knows; a strict one that denies, denies); a
//!   request the limiter cannot decide at all is never let through: a key it refuses
//!   (empty, too long) or a forwarded address that is none is answered 400 (gRPC:
//!   INVALID_ARGUMENT), a store that failed where the namespace waits on it 503
//!   (UNAVAILABLE), a server that gives no peer address 500 (INTERNAL).
//!
//! ```
//! # async fn run() -> anyhow::Result<()> {
//! use std::net::SocketAddr;
//! use std::sync::Arc;
//! use axum::{routing::get, Router};
//! use swin::tower::{ClientAddr, RateLimitLayer};
//!
//! let config = swin::config::Config::from_toml(
//!     "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
//!      limits = [{ window_size = 60, limit = 100 }]\n",
//! )?;
//! let limiter = Arc::new(swin::Limiter::start(config).await?);
//! // each client address its own key, believing X-Forwarded-For from the local proxy only
//! let by_client = ClientAddr::new(["127.0.0.1"])?;
//! let app: Router = Router::new()
//!     .route("/", get(|| async { "hello" }))
//!     .layer(RateLimitLayer::new(limiter, "api", by_client));
//! // the peer's address reaches the layer as axum's ConnectInfo
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>());
//! # drop(server);
//! # Ok(())
//! # }
//! ```

mod answers;
mod keys;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};

use crate::Limiter;
use answers::{denied, headers, is_grpc, no_key, undecided};
pub use keys::{ClientAddr, HeaderKey, KeyExtractor, NoKey, PeerAddr};

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
    /// A layer deciding each request as a hit on `key`'s key of `namespace` in
    /// `limiter`; a request whose key is `None` passes (see [`KeyExtractor`]).
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
    F: KeyExtractor<B> + Clone + Send + Sync + 'static,
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
        let key = match self.key.key(&request) {
            Ok(Some(key)) => key,
            Ok(None) => return Box::pin(inner.call(request)),
            Err(e) => {
                let answer = no_key(&e, is_grpc(&request));
                return Box::pin(std::future::ready(Ok(answer)));
            }
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
