//! Decisions over HTTP:
//! - `POST /v1/namespaces/{namespace}/keys/{key}/hit`: may this hit pass? 200 when
//!   allowed, 429 when denied, with the IETF `RateLimit-Policy` and `RateLimit` headers
//!   and, on a 429, `Retry-After`;
//! - `POST …/refund`: gives back hits admitted but not used;
//! - `POST /v1/hits`: several namespaces and keys at once, the strictest decision wins
//!   (Boulder's BatchSpend) and a denied batch spends nothing;
//! - `/v1/auth/{namespace}` (any method): the same decision for a proxy — nginx
//!   `auth_request`, Traefik ForwardAuth — with the key taken from a header or the
//!   client's address (`key_from`).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{on, post, MethodFilter};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::extract::{ApiPath, JsonBody, RawJson};
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::requests::Verdict;

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/hit",
            post(hit),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/refund",
            post(refund),
        ),
        Route::new("POST", "/v1/hits", post(hits_batch)),
        // the standard methods (a proxy asks with its client's), the rest 405
        Route::new("*", "/v1/auth/{namespace}", on(standard_methods(), auth)),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct HitBody {
    cost: f64,
    dry_run: bool,
}

impl Default for HitBody {
    fn default() -> Self {
        HitBody {
            cost: 1.0,
            dry_run: false,
        }
    }
}

/// An answer over HTTP: `status`, the JSON `body` and the answer's `headers` (see
/// [`Verdict::headers`]: the headers of draft-ietf-httpapi-ratelimit-headers, one policy
/// per limit and the current state of the strictest; `t` on a denial is when this hit
/// would pass, and Retry-After is never earlier than it).
pub(super) fn respond(
    headers: Vec<(&'static str, String)>,
    status: StatusCode,
    body: impl Serialize,
) -> Response {
    let mut resp = (status, Json(body)).into_response();
    let h = resp.headers_mut();
    for (name, value) in headers {
        if let (Some(name), Ok(value)) = (header_name(name), HeaderValue::try_from(value)) {
            h.insert(name, value);
        }
    }
    resp
}

/// The name of one of an answer's headers as HTTP writes it (the ones the library
/// names now without an allocation).
fn header_name(name: &'static str) -> Option<HeaderName> {
    Some(match name {
        "RateLimit-Policy" => HeaderName::from_static("ratelimit-policy"),
        "RateLimit" => HeaderName::from_static("ratelimit"),
        "Retry-After" => axum::http::header::RETRY_AFTER,
        "swin-shadow-denied" => HeaderName::from_static("swin-shadow-denied"),
        other => return HeaderName::from_bytes(other.as_bytes()).ok(),
    })
}

pub(super) fn status_of(v: &Verdict) -> StatusCode {
    if v.allowed() {
        StatusCode::OK
    } else {
        StatusCode::TOO_MANY_REQUESTS
    }
}

async fn hit(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<HitBody>,
) -> Result<Response, ApiError> {
    let v = match body.dry_run {
        true => state.limiter.check(&namespace, &key, body.cost).await?,
        false => state.limiter.hit(&namespace, &key, body.cost).await?,
    };
    Ok(respond(v.headers(), status_of(&v), &v))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RefundBody {
    cost: f64,
}

impl Default for RefundBody {
    fn default() -> Self {
        RefundBody { cost: 1.0 }
    }
}

/// `POST /v1/namespaces/{namespace}/keys/{key}/refund`, body `{"cost": 1}`.
async fn refund(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<RefundBody>,
) -> Result<Response, ApiError> {
    let r = state.limiter.refund(&namespace, &key, body.cost).await?;
    Ok(Json(r).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchHit {
    namespace: String,
    key: String,
    #[serde(default = "one")]
    cost: f64,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    hits: Vec<BatchHit>,
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Serialize)]
struct BatchResult<'a> {
    namespace: &'a str,
    key: &'a str,
    #[serde(flatten)]
    answer: &'a Verdict,
}

#[derive(Debug, Serialize)]
struct BatchAnswer<'a> {
    #[serde(flatten)]
    answer: &'a Verdict,
    /// Whether the hits were counted: only when every one was allowed (and not a dry run).
    spent: bool,
    results: Vec<BatchResult<'a>>,
}

/// `POST /v1/hits`, body `{"hits":[{"namespace":"api","key":"k","cost":1}, …],
/// "dry_run":false}`: every hit decided, the strictest wins (its fields at the top, its
/// status and headers on the response). All or nothing: when any hit is denied, the
/// allowed ones are given back, so a denied batch spends nothing (denied hits of a
/// `count_denied` namespace still count, as they would alone).
async fn hits_batch(
    State(state): State<Arc<AppState>>,
    RawJson(bytes): RawJson,
) -> Result<Response, ApiError> {
    let Some(bytes) = bytes else {
        return Err(Error::BadRequest(
            "body must be {\"hits\": [{\"namespace\": …, \"key\": …}, …]}".into(),
        )
        .into());
    };
    let body: BatchBody = super::extract::parse_json(Some(&bytes))?;
    let asked: Vec<(&str, &str, f64)> = body
        .hits
        .iter()
        .map(|h| (h.namespace.as_str(), h.key.as_str(), h.cost))
        .collect();
    let batch = state
        .limiter
        .hits(&asked, body.dry_run, state.max_batch)
        .await?;
    let answer = BatchAnswer {
        answer: batch.strictest(),
        spent: !batch.denied() && !body.dry_run,
        results: body
            .hits
            .iter()
            .zip(batch.verdicts())
            .map(|(h, v)| BatchResult {
                namespace: &h.namespace,
                key: &h.key,
                answer: v,
            })
            .collect(),
    };
    Ok(respond(
        batch.headers(),
        status_of(batch.strictest()),
        answer,
    ))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthQuery {
    cost: f64,
    /// The status of a denial: 429 (Traefik passes it on), or 401/403 for nginx, whose
    /// `auth_request` treats any other status as an error.
    deny_status: u16,
}

impl Default for AuthQuery {
    fn default() -> Self {
        AuthQuery {
            cost: 1.0,
            deny_status: 429,
        }
    }
}

fn standard_methods() -> MethodFilter {
    [
        MethodFilter::POST,
        MethodFilter::PUT,
        MethodFilter::DELETE,
        MethodFilter::PATCH,
        MethodFilter::HEAD,
        MethodFilter::OPTIONS,
        MethodFilter::TRACE,
    ]
    .into_iter()
    .fold(MethodFilter::GET, MethodFilter::or)
}

/// `/v1/auth/{namespace}[?cost=1&deny_status=429]`, any method: a hit on the key the
/// namespace's `key_from` names, answered 200 (allowed) or `deny_status` (denied), with
/// the RateLimit headers either way. A request without the configured key header gets
/// 401: it carries nothing to limit by.
async fn auth(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
    query: Result<Query<AuthQuery>, axum::extract::rejection::QueryRejection>,
    parts: Parts,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("query: {}", e.body_text())))?;
    let deny = match q.deny_status {
        401 | 403 | 429 => {
            StatusCode::from_u16(q.deny_status).unwrap_or(StatusCode::TOO_MANY_REQUESTS)
        }
        other => {
            return Err(Error::BadRequest(format!(
                "deny_status must be 401, 403 or 429, got {other}"
            ))
            .into())
        }
    };
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| *a);
    let trusted = state.trusted_proxies.load();
    let key = state
        .limiter
        .request_key(&namespace, peer, &parts.headers, &trusted)?;
    let key = match key {
        Ok(key) => key,
        Err(what) => {
            return Ok((
                StatusCode::UNAUTHORIZED,
                Json(serde_json::json!({"error": {"code": "no_key", "message": what}})),
            )
                .into_response())
        }
    };
    let v = state.limiter.hit(&namespace, &key, q.cost).await?;
    let status = if v.allowed() { StatusCode::OK } else { deny };
    Ok(respond(v.headers(), status, &v))
}
