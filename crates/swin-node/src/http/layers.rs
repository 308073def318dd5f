//! The two layers every route runs under, written as plain tower services: what each
//! does before the route is synchronous, so the route's service is called in place and
//! its future wrapped, never boxed. (axum's `middleware::from_fn` clones the whole inner
//! stack into a box and boxes its future on every request: measured at about a tenth of
//! a `/hit`'s instructions for the two.)
//! - [`Front`]: the bounds of a request's head, its trace span, and the route counted by
//!   status and timed (every route, the fallbacks included).
//! - [`Gate`]: a check that answers the request itself or lets it through to the route
//!   (the areas' bearer tokens, [`super::auth`]).

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready as ready_poll, Context, Poll};
use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::response::Response;
use futures_util::future::Either;
use tower::{Layer, Service};
use tracing::instrument::Instrumented;
use tracing::Instrument;

use crate::state::AppState;

/// A check run before a route: `Some(answer)` answers the request, `None` lets it
/// through (the check may add to the request, e.g. who made it).
pub(super) trait Check: Clone + Send + Sync + 'static {
    fn check(&self, req: &mut Request) -> Option<Response>;
}

/// The layer of a [`Check`].
#[derive(Clone)]
pub(super) struct Gate<C>(pub(super) C);

impl<S, C: Clone> Layer<S> for Gate<C> {
    type Service = Gated<S, C>;

    fn layer(&self, inner: S) -> Gated<S, C> {
        Gated {
            inner,
            check: self.0.clone(),
        }
    }
}

/// A route behind a [`Check`].
#[derive(Clone)]
pub(super) struct Gated<S, C> {
    inner: S,
    check: C,
}

type Answered = Ready<Result<Response, Infallible>>;

impl<S, C> Service<Request> for Gated<S, C>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    C: Check,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<S::Future, Answered>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        match self.check.check(&mut req) {
            Some(answer) => Either::Right(ready(Ok(answer))),
            // ready: `poll_ready` asked the route
            None => Either::Left(self.inner.call(req)),
        }
    }
}

/// What every request goes through, in one layer: the bounds of its head, then the
/// route, counted by route and status and timed.
#[derive(Clone)]
pub(super) struct Front(pub(super) Arc<AppState>);

impl<S> Layer<S> for Front {
    type Service = Fronted<S>;

    fn layer(&self, inner: S) -> Fronted<S> {
        Fronted {
            inner,
            state: self.0.clone(),
        }
    }
}

/// A route behind [`Front`].
#[derive(Clone)]
pub(super) struct Fronted<S> {
    inner: S,
    state: Arc<AppState>,
}

impl<S> Service<Request> for Fronted<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Counted<Either<S::Future, Answered>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        // MatchedPath is an Arc: the route's name is not copied per request
        let route = req.extensions().get::<MatchedPath>().cloned();
        let start = Instant::now();
        let span = request_span(&req, route.as_ref());
        let inner = match super::bounded_head(&req) {
            Some(refused) => Either::Right(ready(Ok(refused))),
            None => Either::Left(span.in_scope(|| self.inner.call(req))),
        };
        Counted {
            inner: inner.instrument(span),
            state: self.state.clone(),
            route,
            start,
        }
    }
}

/// The request's span: none unless traces are on and this request is sampled.
fn request_span(req: &Request, route: Option<&MatchedPath>) -> tracing::Span {
    let name = route.map_or("unmatched", MatchedPath::as_str);
    crate::telemetry::request_span(crate::telemetry::sample(req.headers()), || {
        tracing::trace_span!(
        target: crate::telemetry::REQUEST,
        "request",
        otel.name = %format_args!("{} {name}", req.method()),
        otel.kind = "server",
        http.request.method = %req.method(),
        http.route = name,
        http.response.status_code = tracing::field::Empty,
        namespace = tracing::field::Empty,
        decision = tracing::field::Empty,
        )
    })
}

pin_project_lite::pin_project! {
    /// A route's answer under way; when it comes, counted by route and status, timed
    /// and written on the request's span.
    pub(super) struct Counted<F> {
        #[pin]
        inner: Instrumented<F>,
        state: Arc<AppState>,
        route: Option<MatchedPath>,
        start: Instant,
    }
}

impl<F> Future for Counted<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let Ok(resp) = ready_poll!(this.inner.as_mut().poll(cx));
        let took = this.start.elapsed();
        let status = resp.status().as_u16();
        this.inner
            .span()
            .record("http.response.status_code", i64::from(status));
        let route = this.route.as_ref().map_or("unmatched", MatchedPath::as_str);
        let metrics = &this.state.metrics;
        metrics.http_request(route, status);
        metrics.request_took(crate::metrics::Door::Http, route, took);
        Poll::Ready(Ok(resp))
    }
}
