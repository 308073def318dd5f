//! Keys' limits set at run time (scope `limits` to change them, `limits` or `admin` to
//! read them):
//!
//! - `PUT /v1/namespaces/{namespace}/keys/{key}/limits` — `{"limits": [{"window_size":
//!   60, "limit": 3}]}` (or `{"gcra": {"burst", "count", "period"}}` on a GCRA
//!   namespace), optionally `"expires_in"` seconds: the key's limits from now on, on
//!   every node (see [`swin::runtime_limits`]); answers the key's limits.
//! - `GET` the same path: the key's limits and where they come from (`override`, or
//!   `config` for the namespace's limits and the file's overrides).
//! - `DELETE` it: the config's limits again.
//! - `GET /v1/namespaces/{namespace}/limits?after=KEY&count=N`: runtime limits in key
//!   order.
//! - `GET /v1/namespaces/{namespace}/top?by=denied|hits&count=N`: who is being limited —
//!   the heaviest keys of the last minute on this node (see [`swin::status::TopKeys`]).
//!
//! Keys are counter keys, so a runtime limit on `key=value|…` applies to that Envoy
//! descriptor. Every change is logged with the token's name and counted.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::Extensions;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Json;
use serde::Deserialize;
use tracing::info;

use super::auth::Caller;
use super::error::ApiError;
use super::extract::{ApiPath, JsonBody};
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::requests::Change;
use swin::status::TopBy;

const KEY_LIMITS: &str = "/v1/namespaces/{namespace}/keys/{key}/limits";

/// What the `limits` scope alone opens: changing a key's limits.
pub(super) fn writes() -> Vec<Route> {
    vec![
        Route::new("PUT", KEY_LIMITS, put(set)),
        Route::new("DELETE", KEY_LIMITS, axum::routing::delete(remove)),
    ]
}

/// What `limits` or `admin` opens: reading them.
pub(super) fn reads() -> Vec<Route> {
    vec![
        Route::new("GET", KEY_LIMITS, get(show)),
        Route::new("GET", "/v1/namespaces/{namespace}/limits", get(list)),
        Route::new("GET", "/v1/namespaces/{namespace}/top", get(top)),
    ]
}

/// Keys a list answers at most (and by default, 100).
const MAX_LIST: usize = 1_000;

async fn set(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    extensions: Extensions,
    JsonBody(change): JsonBody<Change>,
) -> Result<Response, ApiError> {
    let caller = Caller::of(&extensions);
    let change = change.by(caller.to_string());
    let set = state.limiter.set_limits(&namespace, &key, change).await?;
    let doc = crate::metrics::document(&set);
    info!(
        namespace,
        key,
        by = &*caller,
        limits = %serde_json::json!({"limits": doc["limits"], "gcra": doc.get("gcra")}),
        expires_at = doc["expires_at"].as_f64(),
        "runtime limits set"
    );
    Ok(Json(set).into_response())
}

async fn remove(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    extensions: Extensions,
) -> Result<Response, ApiError> {
    let had = state.limiter.remove_limits(&namespace, &key).await?;
    if had {
        let caller = Caller::of(&extensions);
        info!(namespace, key, by = &*caller, "runtime limits deleted");
    }
    // the key's limits as they decide now: the config's, unless another set came since
    let now = state.limiter.limits(&namespace, &key).await?;
    let mut body = serde_json::to_value(now).map_err(|_| Error::Internal)?;
    body["deleted"] = had.into();
    Ok(Json(body).into_response())
}

async fn show(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let limits = state.limiter.limits(&namespace, &key).await?;
    Ok(Json(limits).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    count: Option<String>,
}

async fn list(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
    state.served(&namespace)?;
    let count = match query.count.as_deref() {
        None => 100,
        Some(c) => match c.parse::<usize>() {
            Ok(n) if (1..=MAX_LIST).contains(&n) => n,
            _ => {
                return Err(Error::BadRequest(format!(
                    "count: {c:?} is not a whole number from 1 to {MAX_LIST}"
                ))
                .into())
            }
        },
    };
    let page = state
        .limiter
        .list_limits(&namespace, query.after.as_deref(), count)
        .await?;
    // where the namespace keeps its overrides: its store (every node holds them), or
    // this node when it has none
    let status = state.limiter.status();
    let ns = status.iter().find(|n| n.name() == namespace);
    let kept = match ns.map(|n| crate::metrics::document(n)["store"].is_null()) {
        Some(false) => "store",
        _ => "node",
    };
    let next = (page.len() == count).then(|| {
        page.last()
            .map(|l| crate::metrics::document(l)["key"].take())
    });
    Ok(Json(serde_json::json!({
        "namespace": namespace,
        "kept": kept,
        "limits": page,
        "next": next.flatten(),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TopQuery {
    by: Option<String>,
    count: Option<String>,
}

/// Keys a top list answers at most (and by default, 10).
const MAX_TOP: usize = 100;

/// `GET /v1/namespaces/{namespace}/top?by=denied|hits&count=N`: the heaviest keys of the
/// last minute on this node, by hits denied (the default) or by hits decided, each with
/// its count and the most that count can be off by. This node's only: a caller wanting
/// the cluster's asks every node and adds counts and errors up per key.
async fn top(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
    query: Result<Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
    state.served(&namespace)?;
    let which = match query.by.as_deref() {
        None | Some("denied") => TopBy::Denied,
        Some("hits") => TopBy::Hits,
        Some(other) => {
            return Err(
                Error::BadRequest(format!("by: {other:?} is not \"denied\" or \"hits\"")).into(),
            )
        }
    };
    let count = match query.count.as_deref() {
        None => 10,
        Some(c) => match c.parse::<usize>() {
            Ok(n) if (1..=MAX_TOP).contains(&n) => n,
            _ => {
                return Err(Error::BadRequest(format!(
                    "count: {c:?} is not a whole number from 1 to {MAX_TOP}"
                ))
                .into())
            }
        },
    };
    Ok(Json(state.limiter.top_keys(&namespace, which, count)?).into_response())
}
