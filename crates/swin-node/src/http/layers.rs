//! The layer every route runs under, written as a plain tower service: what it does
//! before the route is synchronous, so the route's service is called in place and its
//! future wrapped, never boxed. (axum's `middleware::from_fn` clones the whole inner
//! stack into a box and boxes its future on every request: measured at about a tenth of
//! a `/hit`'s instructions for the two it replaced.)
//! [`Front`]: the bounds of a request's head, its trace span, the bearer token its route
//! needs ([`super::auth`]), a run once for an idempotency key ([`super::idempotency`]),
//! and the route counted by status and timed (every route, the fallbacks included). One layer: each layer axum nests is a boxed route cloned per
//! request.

use std::convert::Infallible;
use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready as ready_poll, Context, Poll};
use std::time::Instant;

use std::collections::HashMap;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::response::Response;
use futures_util::future::Either;
use tower::{Layer, Service};
use tracing::instrument::Instrumented;
use tracing::Instrument;

use super::idempotency::{self, Boxed};
use crate::config::Scope;
use crate::state::AppState;

/// The scopes a route needs a token for, one of them: by path template, then method
/// (`*`: any). A route not listed for the request's method is open (its 405 needs no
/// token), as is the fallback.
pub(super) type Scopes = HashMap<&'static str, Vec<(&'static str, &'static [Scope])>>;

/// The methods a `*` route serves (the standard ones; another is its 405, which needs no
/// token).
const STANDARD: &[&str] = &["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"];

/// What every request goes through, in one layer: the bounds of its head, the token its
/// route needs, then the route, counted by route and status and timed.
#[derive(Clone)]
pub(super) struct Front {
    pub(super) state: Arc<AppState>,
    pub(super) scopes: Arc<Scopes>,
}

impl<S> Layer<S> for Front {
    type Service = Fronted<S>;

    fn layer(&self, inner: S) -> Fronted<S> {
        Fronted {
            inner,
            front: self.clone(),
        }
    }
}

/// A route behind [`Front`].
#[derive(Clone)]
pub(super) struct Fronted<S> {
    inner: S,
    front: Front,
}

impl Front {
    /// The refusal of a request without a token its route needs (when the node has
    /// `[auth]`).
    fn authorize(&self, route: Option<&MatchedPath>, req: &mut Request) -> Option<Response> {
        let auth = self.state.auth.load();
        let auth = auth.as_ref()?;
        let method = match *req.method() {
            Method::HEAD => "GET",
            ref m => m.as_str(),
        };
        let scopes = self
            .scopes
            .get(route?.as_str())?
            .iter()
            .find(|(m, _)| *m == method || (*m == "*" && STANDARD.contains(&method)))?
            .1;
        super::auth::authorize(&self.state, auth, scopes, req)
    }
}

impl<S> Service<Request> for Fronted<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Counted<Either<Either<S::Future, Boxed>, Ready<Result<Response, Infallible>>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        // MatchedPath is an Arc: the route's name is not copied per request
        let route = req.extensions().get::<MatchedPath>().cloned();
        let start = Instant::now();
        let span = request_span(&req, route.as_ref());
        // in the span: a refused token's log lines are the request's
        let refused = span.in_scope(|| {
            super::bounded_head(&req).or_else(|| self.front.authorize(route.as_ref(), &mut req))
        });
        let once = route
            .as_ref()
            .is_some_and(|r| idempotency::wanted(r.as_str(), &req));
        let inner = match refused {
            Some(refused) => Either::Right(ready(Ok(refused))),
            None if once => {
                // the service made ready goes with the request; a clone stays for the next
                let clone = self.inner.clone();
                let route = std::mem::replace(&mut self.inner, clone);
                let state = self.front.state.clone();
                Either::Left(Either::Right(idempotency::once(state, route, req)))
            }
            // ready: `poll_ready` asked the route
            None => Either::Left(Either::Left(span.in_scope(|| self.inner.call(req)))),
        };
        Counted {
            inner: inner.instrument(span),
            state: self.front.state.clone(),
            route,
            start,
        }
    }
}

/// The request's span: none unless traces are on and this request is sampled.
fn request_span(req: &Request, route: Option<&MatchedPath>) -> tracing::Span {
    let name = route.map_or("unmatched", MatchedPath::as_str);
    crate::telemetry::request_span(req.headers(), || {
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
        metrics.http_request(route, status, took);
        Poll::Ready(Ok(resp))
    }
}
