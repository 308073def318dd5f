//! Concurrency leases over HTTP (scope `decide`), on `algorithm = "concurrency"`
//! namespaces (see [`swin::leases`]):
//! - `POST /v1/namespaces/{namespace}/keys/{key}/acquire`, body optional `{"count": 1,
//!   "ttl": S, "lease": "<own id>"}` → 200 `{"allowed": true, "lease", "in_flight",
//!   "limit", "expires_at"}` or 429 `{"allowed": false, "in_flight", "limit",
//!   "retry_after"}`, with the RateLimit headers (and Retry-After on a 429);
//! - `POST …/release` `{"lease": "<id>"}` → 200 `{"released": true, "lease"}` (and
//!   `"replayed": true` when an earlier release ended it, less than two minutes ago: a
//!   release sent again after its answer was lost);
//! - `POST …/renew` `{"lease": "<id>", "ttl": S}` → 200 `{"renewed": true, "lease",
//!   "expires_at"}`.
//!
//! A release or renewal of a lease that is not live (lapsed, never granted, released
//! more than two minutes ago; a renewal: released at all) is 404 `unknown_lease` and
//! changes nothing.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{ApiPath, JsonBody};
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::requests::AcquireRequest;

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/acquire",
            post(acquire),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/release",
            post(release),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/renew",
            post(renew),
        ),
    ]
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct AcquireBody {
    count: u32,
    ttl: Option<f64>,
    lease: Option<String>,
}

impl Default for AcquireBody {
    fn default() -> Self {
        AcquireBody {
            count: 1,
            ttl: None,
            lease: None,
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseBody {
    #[serde(default)]
    lease: Option<String>,
    ttl: Option<f64>,
}

impl LeaseBody {
    fn lease(&self) -> Result<&str, Error> {
        self.lease
            .as_deref()
            .ok_or_else(|| Error::BadRequest("lease: required (the id an acquire answered)".into()))
    }
}

pub(super) fn secs(t: std::time::SystemTime) -> f64 {
    // whole milliseconds, as the store keeps them
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_millis() as f64 / 1e3)
}

async fn acquire(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<AcquireBody>,
) -> Result<Response, ApiError> {
    let req = AcquireRequest::new(body.count, body.ttl, body.lease);
    let a = state.limiter.acquire(&namespace, &key, req).await?;
    let status = match a.allowed() {
        true => StatusCode::OK,
        false => StatusCode::TOO_MANY_REQUESTS,
    };
    Ok(super::decisions::respond(a.headers(), status, &a))
}

async fn release(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<LeaseBody>,
) -> Result<Response, ApiError> {
    if body.ttl.is_some() {
        return Err(Error::BadRequest(
            "ttl: a release takes only the lease (renew moves its lapse)".into(),
        )
        .into());
    }
    let lease = body.lease()?;
    let replayed = state.limiter.release(&namespace, &key, lease).await?;
    let mut body = serde_json::json!({"released": true, "lease": lease});
    if replayed {
        // a release sent again: the lease was ended by an earlier one
        body["replayed"] = true.into();
    }
    Ok(Json(body).into_response())
}

async fn renew(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<LeaseBody>,
) -> Result<Response, ApiError> {
    let lease = body.lease()?;
    let to = state
        .limiter
        .renew(&namespace, &key, lease, body.ttl)
        .await?;
    Ok(Json(serde_json::json!({
        "renewed": true,
        "lease": lease,
        "expires_at": secs(to),
    }))
    .into_response())
}
