//! A tower layer that puts a [`Limiter`] in front of a service's routes (feature
//! `tower`): [`LimiterLayer`]. Each request whose [`KeyExtractor`] names a key is a hit
//! on that key of one namespace, of the request's [`Cost`] (1 unless told), decided as
//! `POST /v1/namespaces/{namespace}/keys/{key}/hit` decides it — across every node
//! sharing the namespace's store.
//!
//! - Built once, checked once: [`LimiterLayer::builder`] takes the limiter and the
//!   namespace, and [`LimiterLayerBuilder::build`] fails ([`BuildError`]) for a namespace
//!   the limiter does not serve or cannot decide hits on (one that only counts, one of
//!   leases), instead of refusing every request later.
//! - The key: [`ClientAddr`] (the client's address behind the proxies you trust, as the
//!   daemon decides it), [`PeerAddr`] (the connection's peer), [`HeaderKey`] (all the
//!   bytes of a header, for a header a layer in front has authenticated), or a closure
//!   `Fn(&Request<B>) -> Option<String>`.
//! - A request whose key is `None` passes, unlimited, and costs nothing: no allocation,
//!   no boxed future. That is the service's explicit choice (a closure's `None`; the
//!   ready extractors never answer it: [`HeaderKey`] refuses a request without its
//!   header), so a key function returns it only for requests meant to be unlimited —
//!   never for a value it cannot read (`to_str().ok()` lets every client that sends a
//!   byte past ASCII through).
//! - An allowed request reaches the inner service; its response carries `RateLimit` and
//!   `RateLimit-Policy` (and `swin-shadow-denied` when it passed only because what would
//!   deny it is in shadow).
//! - A refused one never reaches the inner service. By default ([`Refusals`]) a denied
//!   request is answered 429 with `Retry-After` and those headers; a gRPC request
//!   (`content-type: application/grpc…`) as gRPC answers, RESOURCE_EXHAUSTED. An error
//!   hook ([`LimiterLayerBuilder::on_refused`], a closure of [`Refused`]) answers
//!   instead; the headers of a denial are added to what it answers.
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
//! use swin::tower::{ClientAddr, LimiterLayer};
//!
//! let config = swin::config::Config::from_toml(
//!     "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
//!      limits = [{ window_size = 60, limit = 100 }]\n",
//! )?;
//! let limiter = Arc::new(swin::Limiter::start(config).await?);
//! // each client address its own key (IPv6: its /64), believing X-Forwarded-For from
//! // the local proxy only
//! let layer = LimiterLayer::builder(limiter, "api")
//!     .key(ClientAddr::new(["127.0.0.1"])?)
//!     .cost(1.0)
//!     .build()?;
//! let app: Router = Router::new().route("/", get(|| async { "hello" })).layer(layer);
//! // the peer's address reaches the layer as axum's ConnectInfo
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let server = axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>());
//! # drop(server);
//! # Ok(())
//! # }
//! ```

mod answers;
mod future;
mod keys;

use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};

use crate::Limiter;
pub use answers::{OnRefused, Refusals, Refused};
pub use future::LimitedFuture;
pub use keys::{ClientAddr, Cost, HeaderKey, KeyExtractor, NoKey, PeerAddr};

/// Limits the requests of the services it wraps by a key of one namespace (see the
/// module's documentation). Built by [`LimiterLayer::builder`].
#[derive(Clone)]
pub struct LimiterLayer<K, C = f64, H = Refusals> {
    limiter: Arc<Limiter>,
    namespace: Arc<str>,
    key: K,
    cost: C,
    on_refused: H,
}

impl<K, C, H> std::fmt::Debug for LimiterLayer<K, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterLayer")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// The layer's earlier name.
#[deprecated(
    note = "named like tower's own `tower::limit::RateLimitLayer`: use `LimiterLayer::builder`"
)]
pub type RateLimitLayer<F> = LimiterLayer<F>;

/// The service's earlier name.
#[deprecated(note = "use `Limited`")]
pub type RateLimit<S, F> = Limited<S, F>;

impl LimiterLayer<()> {
    /// A layer on `namespace` of `limiter`: give it a key ([`LimiterLayerBuilder::key`]),
    /// then [`LimiterLayerBuilder::build`] checks the namespace.
    pub fn builder(limiter: Arc<Limiter>, namespace: &str) -> LimiterLayerBuilder<()> {
        LimiterLayerBuilder {
            limiter,
            namespace: namespace.into(),
            key: (),
            cost: 1.0,
            on_refused: Refusals,
        }
    }
}

impl<K> LimiterLayer<K> {
    /// A layer deciding each request as a hit of 1 on `key`'s key of `namespace` in
    /// `limiter`, unchecked: a namespace it cannot decide refuses every request.
    #[deprecated(note = "use `LimiterLayer::builder`, which checks the namespace once")]
    pub fn new(limiter: Arc<Limiter>, namespace: &str, key: K) -> Self {
        LimiterLayer {
            limiter,
            namespace: namespace.into(),
            key,
            cost: 1.0,
            on_refused: Refusals,
        }
    }
}

/// Builds a [`LimiterLayer`]: its key, its cost per request (1 unless told), its answer
/// to a refused request ([`Refusals`] unless told).
#[must_use = "a builder does nothing until built"]
pub struct LimiterLayerBuilder<K, C = f64, H = Refusals> {
    limiter: Arc<Limiter>,
    namespace: Arc<str>,
    key: K,
    cost: C,
    on_refused: H,
}

impl<K, C, H> std::fmt::Debug for LimiterLayerBuilder<K, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LimiterLayerBuilder")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<K, C, H> LimiterLayerBuilder<K, C, H> {
    /// What each request is counted under ([`KeyExtractor`]).
    pub fn key<K2>(self, key: K2) -> LimiterLayerBuilder<K2, C, H> {
        LimiterLayerBuilder {
            limiter: self.limiter,
            namespace: self.namespace,
            key,
            cost: self.cost,
            on_refused: self.on_refused,
        }
    }

    /// What each request costs ([`Cost`]: a number, or a closure of the request).
    pub fn cost<C2>(self, cost: C2) -> LimiterLayerBuilder<K, C2, H> {
        LimiterLayerBuilder {
            limiter: self.limiter,
            namespace: self.namespace,
            key: self.key,
            cost,
            on_refused: self.on_refused,
        }
    }

    /// How a refused request is answered ([`OnRefused`]: a closure of [`Refused`]).
    pub fn on_refused<H2>(self, on_refused: H2) -> LimiterLayerBuilder<K, C, H2> {
        LimiterLayerBuilder {
            limiter: self.limiter,
            namespace: self.namespace,
            key: self.key,
            cost: self.cost,
            on_refused,
        }
    }
}

impl<K, C: 'static, H> LimiterLayerBuilder<K, C, H> {
    /// The layer, once the limiter serves the namespace and decides hits on it, and a
    /// fixed cost is one a hit can have (a closure's costs are checked per request).
    pub fn build(self) -> Result<LimiterLayer<K, C, H>, BuildError> {
        let name = &*self.namespace;
        if let Some(&cost) = (&self.cost as &dyn std::any::Any).downcast_ref::<f64>() {
            swin_core::check_cost(cost).map_err(|e| BuildError::Cost(e.to_string()))?;
        }
        let status = self
            .limiter
            .namespace_status(name)
            .map_err(|_| BuildError::UnknownNamespace(name.to_owned()))?;
        match status.algorithm {
            None => return Err(BuildError::NoLimits(name.to_owned())),
            Some("concurrency") => return Err(BuildError::Leases(name.to_owned())),
            Some(_) => {}
        }
        Ok(LimiterLayer {
            limiter: self.limiter,
            namespace: self.namespace,
            key: self.key,
            cost: self.cost,
            on_refused: self.on_refused,
        })
    }
}

/// Why a [`LimiterLayer`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The limiter serves no namespace of that name.
    #[error("the limiter serves no namespace {0:?}")]
    UnknownNamespace(String),
    /// The namespace has no limits: it counts, and decides nothing.
    #[error("namespace {0:?} has no limits: it counts, and decides no hit")]
    NoLimits(String),
    /// The namespace limits requests in flight: it takes leases, not hits.
    #[error("namespace {0:?} limits requests in flight (algorithm concurrency): it takes leases, not hits")]
    Leases(String),
    /// The fixed cost is not one a hit can have (negative, not finite, too large): every
    /// request would be refused.
    #[error("cost: {0}")]
    Cost(String),
}

impl<S, K: Clone, C: Clone, H: Clone> tower_layer::Layer<S> for LimiterLayer<K, C, H> {
    type Service = Limited<S, K, C, H>;

    fn layer(&self, inner: S) -> Self::Service {
        Limited {
            inner,
            limiter: self.limiter.clone(),
            namespace: self.namespace.clone(),
            key: self.key.clone(),
            cost: self.cost.clone(),
            on_refused: self.on_refused.clone(),
        }
    }
}

/// A service behind a [`LimiterLayer`].
#[derive(Clone)]
pub struct Limited<S, K, C = f64, H = Refusals> {
    inner: S,
    limiter: Arc<Limiter>,
    namespace: Arc<str>,
    key: K,
    cost: C,
    on_refused: H,
}

impl<S, K, C, H> Limited<S, K, C, H> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, to change.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, the layer let go.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: std::fmt::Debug, K, C, H> std::fmt::Debug for Limited<S, K, C, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limited")
            .field("inner", &self.inner)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl<S, K, C, H, B, ResBody> tower_service::Service<Request<B>> for Limited<S, K, C, H>
where
    S: tower_service::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    K: KeyExtractor<B>,
    C: Cost<B>,
    H: OnRefused<ResBody> + Clone + Send + 'static,
    B: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = LimitedFuture<S::Future, ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let key = match self.key.key(&request) {
            Ok(Some(key)) => key,
            // unlimited: the inner service's own future, nothing boxed, nothing read
            Ok(None) => return LimitedFuture::pass(self.inner.call(request)),
            Err(e) => {
                let grpc = answers::is_grpc(&request);
                let answer = self.on_refused.answer(Refused::NoKey(&e), grpc);
                return LimitedFuture::answered(answer);
            }
        };
        let grpc = answers::is_grpc(&request);
        let cost = self.cost.cost(&request);
        // the service made ready is the one called; a clone is left for the next call
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (limiter, namespace) = (self.limiter.clone(), self.namespace.clone());
        let on_refused = self.on_refused.clone();
        LimitedFuture::deciding(async move {
            match limiter.hit(&namespace, &key, cost).await {
                Ok(v) if v.allowed() => {
                    let mut response = inner.call(request).await?;
                    answers::headers(response.headers_mut(), &v);
                    Ok(response)
                }
                Ok(v) => {
                    let mut response = on_refused.answer(Refused::Denied(&v), grpc);
                    answers::headers(response.headers_mut(), &v);
                    Ok(response)
                }
                Err(e) => Ok(on_refused.answer(Refused::Undecided(&e), grpc)),
            }
        })
    }
}
