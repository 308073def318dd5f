//! Idempotent retries over HTTP: a request of a route listed in [`ROUTES`] that carries
//! an `Idempotency-Key` header is run through `swin::Limiter::once` — the first one runs,
//! a retry with the same key, route and body gets the first answer again (status, body
//! and headers, with `Idempotent-Replayed: true`), on any node, counting nothing more.
//! A request without the header goes straight to its handler (the front layer,
//! [`super::layers::Front`], then costs a header lookup).
//!
//! The record is kept in the route's namespace (`/v1/hits` and `/v1/increments`: the
//! first of their items' namespaces that keeps its records in a store, where every node
//! sees it; a batch of local-only namespaces only is 400), under the route's key (the path
//! after the namespace, its parameters decoded: `keys/user:42/hit`; a batch route's own
//! path) and the idempotency key; the fingerprint is the method, that route key and the
//! body's bytes. The record counts against its client's share: the client is the
//! request's token under `[auth]` (its name, hashed), else its address. A dry run
//! (`"dry_run": true`) changes nothing and keeps no record: a retry is another dry run.
//! The header's value must be 1 to 255 visible ASCII characters, sent once (else 400).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, MatchedPath, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;

use std::net::SocketAddr;

use axum::extract::ConnectInfo;

use super::auth::Caller;
use super::error::ApiError;
use super::extract::RawJson;
use crate::state::AppState;
use swin::error::Error;
use swin::idempotency::{Answer, Idempotent, Once};
use swin::policy::client_address::{client_address, NoAddress};

/// The routes an `Idempotency-Key` makes idempotent (their path templates).
pub(super) const ROUTES: &[&str] = &[
    "/v1/namespaces/{namespace}/keys/{key}/hit",
    "/v1/namespaces/{namespace}/keys/{key}/increment",
    "/v1/namespaces/{namespace}/keys/{key}/refund",
    "/v1/namespaces/{namespace}/keys/{key}/acquire",
    "/v1/namespaces/{namespace}/keys/{key}/renew",
    "/v1/namespaces/{namespace}/keys/{key}/release",
    "/v1/namespaces/{namespace}/keys/{key}/reserve",
    "/v1/namespaces/{namespace}/keys/{key}/commit",
    "/v1/namespaces/{namespace}/keys/{key}/extend",
    "/v1/namespaces/{namespace}/reserve",
    "/v1/namespaces/{namespace}/commit",
    "/v1/namespaces/{namespace}/extend",
    "/v1/hits",
    "/v1/increments",
];

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

/// The prefix of the routes of one namespace.
const NAMESPACED: &str = "/v1/namespaces/{namespace}/";

/// Whether `req`, on the route of path template `route`, is to run once for its
/// idempotency key (the routes of [`ROUTES`] are all POST routes; another method is
/// their 405).
pub(super) fn wanted(route: &str, req: &Request) -> bool {
    req.method() == Method::POST
        && req.headers().contains_key(IDEMPOTENCY_KEY)
        && ROUTES.contains(&route)
}

/// A request's answer under way through [`once`].
pub(super) type Boxed = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

/// Runs `req` through `route` (the route's service, made ready) once for its
/// idempotency key (see the module's note).
pub(super) fn once<S>(state: Arc<AppState>, route: S, req: Request) -> Boxed
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    Box::pin(async move { Ok(idempotent(state, route, req).await) })
}

/// Runs `req` once for its idempotency key.
async fn idempotent<S>(state: Arc<AppState>, inner: S, req: Request) -> Response
where
    S: tower::Service<Request, Response = Response, Error = Infallible> + Send + 'static,
    S::Future: Send + 'static,
{
    let (asked, req) = match asked(&state, req).await {
        Ok(a) => a,
        Err(e) => return e.into_response(),
    };
    let Some(asked) = asked else {
        // no namespace to keep a record in: the handler answers (404, 400)
        return inner.oneshot(req).await.unwrap_or_else(|e| match e {});
    };
    let run = async move {
        let resp = inner.oneshot(req).await.unwrap_or_else(|e| match e {});
        answer_of(resp).await
    };
    match state.limiter.once(asked, run).await {
        Ok(once) => response_of(once),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// What `req` asks under its idempotency key (`None`: it names no namespace to keep a
/// record in), and the request to run, its body read.
async fn asked(
    state: &Arc<AppState>,
    req: Request,
) -> Result<(Option<Idempotent>, Request), ApiError> {
    let key = header_value(req.headers())?.to_vec();
    let (mut parts, body) = req.into_parts();
    let RawJson(bytes) = RawJson::read(Request::from_parts(parts.clone(), body), state).await?;
    let body_bytes = bytes.clone().unwrap_or_default();
    if is_dry_run(&body_bytes) {
        // it changes nothing: a retry is another dry run, and no record is kept
        let req = Request::from_parts(parts, bytes.map_or_else(Body::empty, Body::from));
        return Ok((None, req));
    }
    let route = route_key(&mut parts).await;
    let client = client_of(state, &parts)?;
    let namespace = match &route {
        Some((Some(ns), _)) => Some(ns.clone()),
        Some((None, _)) => {
            let items = item_namespaces(&body_bytes);
            state
                .limiter
                .record_namespace(items.iter().map(String::as_str))?
                .map(str::to_owned)
        }
        None => None,
    };
    let req = Request::from_parts(parts, bytes.map_or_else(Body::empty, Body::from));
    let (Some(namespace), Some((_, route))) = (namespace, route) else {
        return Ok((None, req));
    };
    if state.limiter.serves(&namespace).is_err() {
        return Ok((None, req));
    }
    let method = req.method().as_str().to_owned();
    let asked = Idempotent::new(&namespace, &route, &key, &method, &body_bytes)?.by(&client);
    Ok((Some(asked), req))
}

/// Who sent a request, for its client's share of records (idempotency records, open
/// reservations): the name of the token it carried (under `[auth]`), else its address
/// (`trusted_proxies` read as for `/v1/auth`; the connection's peer when a proxy passed
/// no address). A trusted proxy that passed something other than an address is a bad
/// request (400 naming the header), as for limits keyed by client address: pooled
/// under the proxy's own address, such requests would share (and could fill) its share.
pub(super) fn client_of(state: &AppState, parts: &Parts) -> Result<swin::Client, ApiError> {
    if let Some(Caller(name)) = parts.extensions.get::<Caller>() {
        return Ok(swin::Client::Token(name.to_string()));
    }
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| *a);
    match client_address(peer, &parts.headers, &state.trusted_proxies.load()) {
        Ok(a) => Ok(swin::Client::Address(a)),
        Err(NoAddress::NotAnAddress(v)) => Err(Error::BadRequest(format!(
            "X-Forwarded-For / X-Real-IP: the proxy passed {v:?} as the client's address, which is not an IP address"
        ))
        .into()),
        Err(NoAddress::NoPeer) => Ok(swin::Client::Unknown),
    }
}

/// Whether the body asks a dry run (`"dry_run": true` at its top).
fn is_dry_run(body: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct DryRun {
        #[serde(default)]
        dry_run: bool,
    }
    serde_json::from_slice::<DryRun>(body).is_ok_and(|b| b.dry_run)
}

/// The `Idempotency-Key` header, sent once, checked.
fn header_value(headers: &axum::http::HeaderMap) -> Result<&[u8], Error> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let first = values.next().map_or(&b""[..], HeaderValue::as_bytes);
    if values.next().is_some() {
        return Err(Error::BadRequest(
            "Idempotency-Key: sent more than once; send one key".into(),
        ));
    }
    swin::idempotency::check_idempotency_key(first)?;
    Ok(first)
}

/// The route's namespace (a route of one namespace; `None` for a batch route) and key:
/// the path after the namespace with its parameters decoded, or a batch route's path.
/// `None` when the path's parameters do not decode or its key is not one (the handler
/// answers 400, and no record is claimed for it).
async fn route_key(parts: &mut Parts) -> Option<(Option<String>, String)> {
    let template = parts.extensions.get::<MatchedPath>()?.as_str().to_owned();
    let Some(rest) = template.strip_prefix(NAMESPACED) else {
        // a route with no parameters (a batch): RawPathParams has none to give
        return Some((None, template));
    };
    let params = RawPathParams::from_request_parts(parts, &()).await.ok()?;
    let mut route = rest.to_owned();
    let mut namespace = None;
    for (name, value) in &params {
        if name == "namespace" {
            namespace = Some(value.to_owned());
        } else if name == "key" && swin::policy::input::check_key(value).is_err() {
            return None;
        } else {
            route = route.replace(&format!("{{{name}}}"), value);
        }
    }
    Some((Some(namespace?), route))
}

/// The namespaces of a batch's items, in order (`{"hits": [{"namespace": …}, …]}`, or
/// `increments`); none when the body is not such a batch (its handler refuses it).
fn item_namespaces(body: &[u8]) -> Vec<String> {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let Some(items) = v
        .get("hits")
        .or_else(|| v.get("increments"))
        .and_then(|i| i.as_array())
    else {
        return Vec::new();
    };
    let names: Option<Vec<String>> = items
        .iter()
        .map(|i| i.get("namespace")?.as_str().map(str::to_owned))
        .collect();
    names.unwrap_or_default()
}

/// Headers a kept answer leaves out: the transport's, made again for each answer.
const NOT_KEPT: &[&str] = &["content-length", "date", "connection", "transfer-encoding"];

/// A handler's response as a record keeps it.
async fn answer_of(resp: Response) -> Answer {
    let (parts, body) = resp.into_parts();
    let body: Bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(cause = %e, "an idempotent answer's body could not be read");
            return Answer::new(500, Vec::new(), Vec::new());
        }
    };
    let headers = parts
        .headers
        .iter()
        .filter(|(n, _)| !NOT_KEPT.contains(&n.as_str()))
        .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
        .collect();
    Answer::new(parts.status.as_u16(), headers, body.to_vec())
}

/// A kept (or first) answer as a response.
fn response_of(once: Once) -> Response {
    let replayed = matches!(once, Once::Again(_));
    let answer = once.answer();
    let mut resp = Response::new(Body::from(answer.body().to_vec()));
    *resp.status_mut() = axum::http::StatusCode::from_u16(answer.status())
        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = resp.headers_mut();
    for (name, value) in answer.headers() {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            headers.append(n, v);
        }
    }
    if replayed {
        headers.insert(REPLAYED, HeaderValue::from_static("true"));
    }
    resp
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_idempotent_route_is_a_route_of_the_api() {
        let routes = super::super::routes();
        for path in super::ROUTES {
            assert!(
                routes.iter().any(|(m, p)| *m == "POST" && p == path),
                "{path} is not a POST route"
            );
        }
    }
}

/// The request's client ([`client_of`]), for a handler.
#[derive(Debug)]
pub(super) struct Client(pub(super) swin::Client);

impl FromRequestParts<Arc<AppState>> for Client {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, ApiError> {
        Ok(Client(client_of(state, parts)?))
    }
}
