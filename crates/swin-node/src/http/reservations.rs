//! Reserve, then commit, over HTTP (scope `decide`), on window and GCRA namespaces (see
//! `swin::Limiter::reserve`):
//! - `POST /v1/namespaces/{namespace}/keys/{key}/reserve` `{"cost": estimate, "ttl": S}`
//!   → 200 `{"allowed": true, "reservation": "<id>", "cost", "expires_at", …}` or 429 as
//!   a hit would be, with the RateLimit headers;
//! - `POST …/commit` `{"reservation": "<id>", "cost": actual}` → 200 `{"committed": true,
//!   "reservation", "estimate", "cost", "charged", "given_back", "uncharged", …}`; a
//!   reservation committed already, lapsed or never made is 404 `unknown_reservation`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde::{Deserialize, Serialize};

use super::decisions::{respond, status_of};
use super::error::ApiError;
use super::extract::{ApiPath, JsonBody};
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::requests::HitAnswer;

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/reserve",
            post(reserve),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/commit",
            post(commit),
        ),
    ]
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    cost: Option<f64>,
    ttl: Option<f64>,
}

#[derive(Debug, Serialize)]
struct ReserveAnswer {
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<String>,
    cost: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<f64>,
    #[serde(flatten)]
    answer: HitAnswer,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CommitBody {
    reservation: Option<String>,
    cost: Option<f64>,
}

async fn reserve(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<ReserveBody>,
) -> Result<Response, ApiError> {
    let cost = body
        .cost
        .ok_or_else(|| Error::BadRequest("cost: required (the estimate to spend now)".into()))?;
    let r = state
        .limiter
        .reserve(&namespace, &key, cost, body.ttl)
        .await?;
    let v = r.verdict();
    let (reservation, expires_at) = match r.reservation() {
        Some((id, at)) => (Some(id.clone()), Some(at.0 as f64 / 1e3)),
        None => (None, None),
    };
    let answer = ReserveAnswer {
        reservation,
        cost,
        expires_at,
        answer: v.answer(),
    };
    Ok(respond(v, v.policies(), status_of(v), answer))
}

async fn commit(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<CommitBody>,
) -> Result<Response, ApiError> {
    let id = body.reservation.ok_or_else(|| {
        Error::BadRequest("reservation: required (the id a reserve answered)".into())
    })?;
    let cost = body
        .cost
        .ok_or_else(|| Error::BadRequest("cost: required (the actual cost)".into()))?;
    let s = state.limiter.commit(&namespace, &key, &id, cost).await?;
    Ok(respond(
        s.verdict(),
        s.verdict().policies(),
        StatusCode::OK,
        &s,
    ))
}
