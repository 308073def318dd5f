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
//!   the heaviest keys of the last minute on this node (see [`swin_core::top`]).
//!
//! Keys are counter keys, so a runtime limit on `key=value|…` applies to that Envoy
//! descriptor. Every change is logged with the token's name and counted.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::Extensions;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::Json;
use serde::{Deserialize, Serialize};
use swin_core::UnixMs;
use swin_sync::store::StoredLimit;
use tracing::info;

use super::auth::Caller;
use super::error::ApiError;
use super::extract::{ApiPath, JsonBody};
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::policy::input::check_key;
use swin::policy::limits::{RawGcra, RawKeyLimits, RawLimit};
use swin::requests::Change;
use swin::state::Namespace;

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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetBody {
    #[serde(default)]
    limits: Vec<RawLimit>,
    gcra: Option<RawGcra>,
    expires_in: Option<f64>,
}

/// A key's limits as answered.
#[derive(Debug, Serialize)]
struct KeyAnswer {
    namespace: String,
    key: String,
    /// `override` (set at run time) or `config`.
    source: &'static str,
    limits: Vec<RawLimit>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gcra: Option<RawGcra>,
    /// Unix seconds when an override lapses; `null`: never (or from the config).
    expires_at: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    set_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    set_at: Option<f64>,
    /// Where overrides of this namespace are kept: `store` (every node holds them) or
    /// `node` (a namespace without a store: this node only).
    kept: &'static str,
    /// Stored limits this namespace cannot hold, as stored (they do not decide).
    #[serde(skip_serializing_if = "Option::is_none")]
    ignored: Option<String>,
}

fn secs(t: UnixMs) -> f64 {
    t.0 as f64 / 1e3
}

fn kept(ns: &Namespace) -> &'static str {
    if ns.keeps_limits_in_store() {
        "store"
    } else {
        "node"
    }
}

/// The key's answer from its runtime limits, or from the config's when it has none.
/// Stored limits the namespace cannot hold (written by hand, or set before its window
/// sizes or algorithm changed) do not decide: the answer is the config's, with
/// `ignored` saying what was stored.
fn answer(ns: &Namespace, namespace: &str, key: &str, runtime: Option<&StoredLimit>) -> KeyAnswer {
    let base = |source, raw: RawKeyLimits| {
        let (limits, gcra) = raw.into_parts();
        KeyAnswer {
            namespace: namespace.to_owned(),
            key: key.to_owned(),
            source,
            limits,
            gcra,
            expires_at: None,
            set_by: None,
            set_at: None,
            kept: kept(ns),
            ignored: None,
        }
    };
    let held = runtime.map(|s| (s, ns.runtime_limits_of(s)));
    match held {
        Some((stored, Some(limits))) => KeyAnswer {
            expires_at: stored.expires_at.map(secs),
            set_by: Some(stored.set_by.clone()),
            set_at: Some(secs(stored.set_at)),
            ..base("override", RawKeyLimits::of(&limits))
        },
        _ => {
            let config = ns
                .limits()
                .as_ref()
                .map(|l| RawKeyLimits::of(l.for_key(key)))
                // a namespace of descriptor rules: the descriptor's rule decides
                .unwrap_or_default();
            KeyAnswer {
                ignored: held.map(|(stored, _)| stored.limits.clone()),
                ..base("config", config)
            }
        }
    }
}

async fn set(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    extensions: Extensions,
    JsonBody(body): JsonBody<SetBody>,
) -> Result<Response, ApiError> {
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let caller = Caller::of(&extensions);
    let change = Change::new(
        RawKeyLimits::new(body.limits, body.gcra),
        body.expires_in,
        caller.to_string(),
    );
    let stored = state.limiter.set_limits(&namespace, &key, change).await?;
    info!(
        namespace,
        key,
        by = &*caller,
        limits = stored.limits,
        expires_at = stored.expires_at.map(|t| t.0),
        "runtime limits set"
    );
    Ok(Json(answer(&ns, &namespace, &key, Some(&stored))).into_response())
}

async fn remove(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    extensions: Extensions,
) -> Result<Response, ApiError> {
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let had = state.limiter.remove_limits(&namespace, &key).await?;
    if had {
        let caller = Caller::of(&extensions);
        info!(namespace, key, by = &*caller, "runtime limits deleted");
    }
    let mut body =
        serde_json::to_value(answer(&ns, &namespace, &key, None)).map_err(|_| Error::Internal)?;
    body["deleted"] = had.into();
    Ok(Json(body).into_response())
}

async fn show(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let stored = state.limiter.limits(&namespace, &key).await?;
    Ok(Json(answer(&ns, &namespace, &key, stored.as_ref())).into_response())
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
    let ns = state.namespace(&namespace)?;
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
    let next = (page.len() == count).then(|| page.last().map(|l| l.key.clone()));
    let items: Vec<KeyAnswer> = page
        .iter()
        .map(|l| answer(&ns, &namespace, &l.key, Some(l)))
        .collect();
    Ok(Json(serde_json::json!({
        "namespace": namespace,
        "limits": items,
        "next": next.flatten(),
        "kept": kept(&ns),
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
    let ns = state.namespace(&namespace)?;
    let (by, sketch) = match query.by.as_deref() {
        None | Some("denied") => ("denied", ns.heaviest().denied()),
        Some("hits") => ("hits", ns.heaviest().hits()),
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
    let answer = sketch.top(count, swin_sync::now().secs());
    let keys: Vec<serde_json::Value> = answer
        .keys
        .iter()
        .map(|h| serde_json::json!({"key": h.key.as_str(), "count": h.count, "error": h.error}))
        .collect();
    Ok(Json(serde_json::json!({
        "namespace": namespace,
        "by": by,
        "window_secs": swin_core::top::SLOTS as i64 * swin_core::top::SLOT_SECS,
        "keys": keys,
        "total": answer.total,
        "error_bound": answer.bound,
        "scope": "node",
    }))
    .into_response())
}
