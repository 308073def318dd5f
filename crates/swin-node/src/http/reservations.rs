//! Reserve, extend, then commit, over HTTP (scope `decide`), on window and GCRA
//! namespaces (see `swin::Limiter::reserve`):
//! - `POST /v1/namespaces/{namespace}/keys/{key}/reserve` `{"cost": estimate, "ttl": S}`
//!   → 200 `{"allowed": true, "reservation": "<id>", "cost", "expires_at", …}` or 429 as
//!   a hit would be, with the RateLimit headers;
//! - `POST …/keys/{key}/extend` `{"reservation": "<id>", "cost": more}` → 200
//!   `{"allowed": true, "reservation", "total", "expires_at", …}` or 429 (the
//!   reservation stays open at what it had);
//! - `POST …/keys/{key}/commit` `{"reservation": "<id>", "cost": actual}` → 200
//!   `{"committed": true, "reservation", "estimate", "cost", "charged", "given_back",
//!   "uncharged", "debt", …}`; a reservation committed already, lapsed or never made is
//!   404 `unknown_reservation`;
//! - over several keys at once: `POST /v1/namespaces/{namespace}/reserve`
//!   `{"keys": […], "cost", "ttl"}`, `POST …/extend` and `POST …/commit`
//!   `{"reservation", "cost"}`, whose answers carry each key's part in `"keys"`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::post;
use serde::{Deserialize, Serialize};

use super::decisions::{respond, status_of};
use super::error::ApiError;
use super::extract::{ApiPath, JsonBody};
use super::idempotency::Client;
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::requests::{Reserved, Settled, Verdict};

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/reserve",
            post(reserve),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/extend",
            post(extend),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/commit",
            post(commit),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/reserve",
            post(reserve_keys),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/extend",
            post(extend_reservation),
        ),
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/commit",
            post(commit_reservation),
        ),
    ]
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    cost: Option<f64>,
    ttl: Option<f64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReserveKeysBody {
    keys: Option<Vec<String>>,
    cost: Option<f64>,
    ttl: Option<f64>,
}

/// A commit's or an extend's body.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ReservationBody {
    reservation: Option<String>,
    cost: Option<f64>,
}

impl ReservationBody {
    /// The id and the cost, both required (`cost` says what it is for).
    fn parts(self, cost_is: &str) -> Result<(String, f64), Error> {
        let id = self.reservation.ok_or_else(|| {
            Error::BadRequest("reservation: required (the id a reserve answered)".into())
        })?;
        let cost = self
            .cost
            .ok_or_else(|| Error::BadRequest(format!("cost: required ({cost_is})")))?;
        Ok((id, cost))
    }
}

#[derive(Debug, Serialize)]
struct ReserveAnswer<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    reservation: Option<String>,
    cost: f64,
    /// The reservation's total (an extend's answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    total: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at: Option<f64>,
    #[serde(flatten)]
    answer: &'a Verdict,
    /// Each key's verdict (a reservation over several keys).
    #[serde(skip_serializing_if = "Option::is_none")]
    keys: Option<Vec<KeyAnswer<'a>>>,
}

#[derive(Debug, Serialize)]
struct KeyAnswer<'a> {
    key: &'a str,
    #[serde(flatten)]
    answer: &'a Verdict,
}

/// A reserve's or an extend's answer: the cost it took, the strictest key's verdict (and
/// its headers), each key's when `several`, the total when `extend`.
fn reserved(r: &Reserved, several: bool, extend: bool) -> Response {
    let v = r.verdict();
    let (reservation, expires_at) = match r.reservation() {
        Some((id, at)) => (Some(id.to_owned()), Some(super::leases::secs(at))),
        None => (None, None),
    };
    let answer = ReserveAnswer {
        reservation,
        cost: r.cost(),
        total: extend.then(|| r.total()),
        expires_at,
        answer: v,
        keys: several.then(|| {
            r.verdicts()
                .iter()
                .map(|(key, v)| KeyAnswer { key, answer: v })
                .collect()
        }),
    };
    respond(v.headers(), status_of(v), answer)
}

async fn reserve(
    State(state): State<Arc<AppState>>,
    Client(client): Client,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<ReserveBody>,
) -> Result<Response, ApiError> {
    let cost = body
        .cost
        .ok_or_else(|| Error::BadRequest("cost: required (the estimate to spend now)".into()))?;
    let r = state
        .limiter
        .reserve(&namespace, &[&key], cost, body.ttl, Some(&client))
        .await?;
    Ok(reserved(&r, false, false))
}

async fn reserve_keys(
    State(state): State<Arc<AppState>>,
    Client(client): Client,
    ApiPath(namespace): ApiPath<String>,
    JsonBody(body): JsonBody<ReserveKeysBody>,
) -> Result<Response, ApiError> {
    let keys = body.keys.ok_or_else(|| {
        Error::BadRequest("keys: required (the keys to reserve on, 1 or more)".into())
    })?;
    let cost = body
        .cost
        .ok_or_else(|| Error::BadRequest("cost: required (the estimate to spend now)".into()))?;
    let r = state
        .limiter
        .reserve(
            &namespace,
            &keys.iter().map(String::as_str).collect::<Vec<_>>(),
            cost,
            body.ttl,
            Some(&client),
        )
        .await?;
    Ok(reserved(&r, true, false))
}

async fn extend(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<ReservationBody>,
) -> Result<Response, ApiError> {
    let (id, more) = body.parts("the cost to add to the reservation")?;
    let r = state
        .limiter
        .extend(&namespace, Some(&key), &id, more)
        .await?;
    Ok(reserved(&r, false, true))
}

async fn extend_reservation(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
    JsonBody(body): JsonBody<ReservationBody>,
) -> Result<Response, ApiError> {
    let (id, more) = body.parts("the cost to add to the reservation")?;
    let r = state.limiter.extend(&namespace, None, &id, more).await?;
    Ok(reserved(&r, true, true))
}

async fn commit(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<ReservationBody>,
) -> Result<Response, ApiError> {
    let (id, cost) = body.parts("the actual cost")?;
    let s = state.limiter.commit(&namespace, &key, &id, cost).await?;
    Ok(respond(s.after().headers(), StatusCode::OK, &s))
}

#[derive(Debug, Serialize)]
struct CommitAnswer<'a> {
    committed: bool,
    reservation: &'a str,
    estimate: serde_json::Value,
    cost: serde_json::Value,
    keys: &'a [Settled],
}

async fn commit_reservation(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
    JsonBody(body): JsonBody<ReservationBody>,
) -> Result<Response, ApiError> {
    let (id, cost) = body.parts("the actual cost")?;
    let all = state
        .limiter
        .commit_reservation(&namespace, &id, cost)
        .await?;
    // the headers of the key left with the least room
    let strictest = all
        .iter()
        .max_by(|a, b| {
            let (a, b) = (a.after().decision(), b.after().decision());
            a.cmp_strictness(&b)
        })
        .ok_or(Error::Internal)?;
    // the strictest key's settlement as it serializes: its estimate and cost
    let mut settled = crate::metrics::document(strictest);
    let answer = CommitAnswer {
        committed: true,
        reservation: &id,
        estimate: settled["estimate"].take(),
        cost: settled["cost"].take(),
        keys: &all,
    };
    let v = strictest.after();
    Ok(respond(v.headers(), StatusCode::OK, answer))
}
