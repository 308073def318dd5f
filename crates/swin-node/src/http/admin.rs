//! Operating a node over HTTP: reset a key, list namespaces, sync now, health,
//! readiness and metrics.

use std::sync::Arc;
use swin::config::{AdmissionMode, OnStoreFailure};

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::extract::ApiPath;
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::policy::input::check_key;
use swin::state::Namespace;
use swin_sync::now;

/// What the `admin` scope allows: reset a key, list namespaces, sync now, the status
/// page.
pub(super) fn operate() -> Vec<Route> {
    vec![
        Route::new(
            "GET",
            "/ui",
            get(|| async {
                (
                    [
                        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (header::CACHE_CONTROL, "no-store"),
                        (header::CONTENT_SECURITY_POLICY, ui_policy()),
                        (header::X_FRAME_OPTIONS, "DENY"),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                        (header::REFERRER_POLICY, "no-referrer"),
                    ],
                    UI,
                )
            }),
        ),
        Route::new("GET", "/ui/status", get(ui_status)),
        Route::new(
            "DELETE",
            "/v1/namespaces/{namespace}/keys/{key}",
            axum::routing::delete(reset),
        ),
        Route::new("GET", "/v1/namespaces", get(list_namespaces)),
        Route::new("POST", "/v1/namespaces/{namespace}/sync", post(sync_now)),
    ]
}

/// What the `metrics` scope allows.
pub(super) fn metrics_route() -> Vec<Route> {
    vec![Route::new("GET", "/metrics", get(metrics))]
}

/// Open to every client, with or without `[auth]`: liveness, readiness and the API
/// description.
pub(super) fn open() -> Vec<Route> {
    vec![
        Route::new(
            "GET",
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        ),
        Route::new("GET", "/readyz", get(ready)),
        Route::new(
            "GET",
            "/v1/openapi.json",
            get(|| async { ([(header::CONTENT_TYPE, "application/json")], super::OPENAPI) }),
        ),
    ]
}

/// `DELETE /v1/namespaces/{namespace}/keys/{key}`: the key's counts and bucket are
/// deleted in the store, then on this node; other nodes drop theirs at their next sync.
/// 503 when the store cannot be reached (nothing is reset then).
async fn reset(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    ns.sync()
        .reset(&key)
        .await
        .map_err(|e| Error::store(&e, "reset"))?;
    Ok(Json(serde_json::json!({
        "namespace": namespace,
        "key": key,
        "reset": true,
    }))
    .into_response())
}

#[derive(Debug, Serialize)]
struct NamespaceInfo {
    name: String,
    window_sizes: Vec<u32>,
    sync_mode: &'static str,
    sync_rate: f64,
    store: Option<String>,
    /// `sliding_window`, `fixed_window`, `gcra` or `concurrency`; none when the
    /// namespace only counts.
    algorithm: Option<&'static str>,
    /// Concurrency only: leases in flight per key, and a lease's default life (s).
    limit: Option<u64>,
    lease_ttl: Option<f64>,
    counters: usize,
    buckets: usize,
    evictions: u64,
    last_sync_ms: Option<i64>,
    pending_diffs: usize,
    pending_advances: usize,
    degraded: bool,
    /// A short reason (`store_unreachable`, …); the detail is in the log.
    degraded_reason: Option<&'static str>,
    /// `eventual` or `strict`; none when the namespace only counts.
    admission: Option<&'static str>,
    /// Strict only: `local` or `deny`.
    on_store_failure: Option<&'static str>,
    /// Store calls of strict admission: holds of window quota and grants of bucket quota, taken or given back.
    reservations: u64,
    /// Every limit in shadow (`shadow = true`): decided and counted, never denied.
    shadow: bool,
}

fn info(ns: &Namespace) -> NamespaceInfo {
    let st = ns.sync().status();
    let mode = ns.sync().mode();
    NamespaceInfo {
        name: ns.sync().name().to_owned(),
        window_sizes: ns
            .sync()
            .counters()
            .window_sizes()
            .map(|s| s.secs())
            .collect(),
        sync_mode: mode.name(),
        sync_rate: match mode {
            swin_sync::SyncMode::Periodic(p) => p.as_secs_f64(),
            swin_sync::SyncMode::Synchronous => 0.0,
            swin_sync::SyncMode::LocalOnly => -1.0,
        },
        store: ns.store_name().clone(),
        algorithm: match ns.algorithm() {
            swin::policy::algorithm::Algorithm::Concurrency => Some("concurrency"),
            _ => ns.limits().as_ref().map(|l| l.algorithm().name()),
        },
        limit: ns.concurrency().map(|c| c.limit()),
        lease_ttl: ns.concurrency().map(|c| c.lease_ttl().as_secs_f64()),
        counters: ns.sync().counters().len(),
        buckets: ns.sync().counters().buckets().len(),
        evictions: ns.sync().counters().evictions(),
        last_sync_ms: st.last_success_ms,
        pending_diffs: st.pending_diffs,
        pending_advances: st.pending_advances,
        degraded: st.degraded.is_some(),
        degraded_reason: st.degraded,
        admission: ns.limits().as_ref().map(|_| ns.admission_mode().name()),
        on_store_failure: match ns.admission_mode() {
            AdmissionMode::Strict { on_store_failure } => Some(match on_store_failure {
                OnStoreFailure::Local => "local",
                OnStoreFailure::Deny => "deny",
            }),
            AdmissionMode::Eventual => None,
        },
        reservations: ns.sync().reservations(),
        shadow: ns.limits().as_ref().is_some_and(|l| l.shadow()),
    }
}

/// The status page: one HTML file, no assets, refreshing itself from [`ui_status`].
const UI: &str = include_str!("ui.html");

/// The status page's `Content-Security-Policy`: its own inline script and style (by
/// their SHA-256, so an injected one runs nowhere), fetches to this node only, never
/// framed, no forms, no other base.
fn ui_policy() -> &'static str {
    static POLICY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
             img-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            inline_hash(UI, "<script>", "</script>"),
            inline_hash(UI, "<style>", "</style>"),
        )
    });
    &POLICY
}

/// `sha256-<base64>` of what `page` holds between `open` and `close` (a CSP source).
fn inline_hash(page: &str, open: &str, close: &str) -> String {
    use base64::Engine;
    use sha2::{Digest, Sha256};
    let start = page.find(open).expect("the page has the element") + open.len();
    let end = start + page[start..].find(close).expect("the element is closed");
    let digest = Sha256::digest(&page.as_bytes()[start..end]);
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

/// Keys the status page shows per namespace.
const UI_TOP: usize = 5;

/// `GET /ui/status`: what the status page shows — every namespace as `/v1/namespaces`
/// lists it, its most denied keys of the last minute on this node, the node's clock, and
/// the streams of Envoy's quota service open on it (one per proxy).
async fn ui_status(State(state): State<Arc<AppState>>) -> Response {
    let now = now();
    let namespaces = state.namespaces();
    let mut list: Vec<NamespaceInfo> = namespaces.values().map(|n| info(n)).collect();
    list.sort_by(|a, b| a.name.cmp(&b.name));
    let top: serde_json::Map<String, serde_json::Value> = namespaces
        .iter()
        .map(|(name, ns)| {
            let keys: Vec<serde_json::Value> = ns
                .heaviest()
                .denied()
                .top(UI_TOP, now.secs())
                .keys
                .iter()
                .map(|h| serde_json::json!({"key": h.key.as_str(), "count": h.count}))
                .collect();
            (name.clone(), keys.into())
        })
        .collect();
    (
        [(header::CACHE_CONTROL, "no-store")],
        Json(serde_json::json!({
            "now_ms": now.0,
            "namespaces": list,
            "top_denied": top,
            "quota_streams": state.metrics.quota_streams.load(std::sync::atomic::Ordering::Relaxed),
        })),
    )
        .into_response()
}

async fn list_namespaces(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let list: Vec<NamespaceInfo> = state.namespaces().values().map(|n| info(n)).collect();
    Json(serde_json::json!({ "namespaces": list }))
}

async fn sync_now(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let ns = state.namespace(&namespace)?;
    match ns.sync().sync_requested(now()).await {
        Ok(r) => Ok(Json(serde_json::json!({
            "namespace": namespace, "pushed": r.pushed, "fetched": r.fetched, "duration_ms": r.duration_ms
        }))),
        Err(e) => Err(Error::store(&e, &format!("sync of namespace {namespace:?}")).into()),
    }
}

/// What `/readyz` asks of each store-backed namespace (`?store=`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StoreReach {
    /// Reached recently enough to answer with the cluster's counts (see
    /// `NamespaceSync::readiness`): the default.
    #[default]
    Recent,
    /// Reached once since the namespace was built. Through a store outage after that the
    /// node answers every request as its namespaces' `on_store_failure` says, so an
    /// orchestrator keeps it among the addresses it routes to (docs/operations.md).
    Reached,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadyQuery {
    #[serde(default)]
    store: StoreReach,
}

/// 200 when every store-backed namespace has reached its store — recently enough to
/// answer with the cluster's counts, or with `?store=reached` once (the namespaces in an
/// outage are then named under `"degraded"`); 503 naming the namespaces that have not.
async fn ready(
    State(state): State<Arc<AppState>>,
    query: Result<Query<ReadyQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| Error::BadRequest(format!("query: {}", e.body_text())))?;
    let now = now();
    let namespaces = state.namespaces();
    let (mut unready, mut answering) = (Vec::new(), Vec::new());
    for n in namespaces.values() {
        let Err(why) = n.sync().readiness(now) else {
            continue;
        };
        let entry = serde_json::json!({"namespace": n.sync().name(), "reason": why});
        let reached_once = n.sync().status().last_success_ms.is_some();
        if q.store == StoreReach::Reached && reached_once {
            answering.push(entry);
        } else {
            unready.push(entry);
        }
    }
    // namespaces whose totals are still loading: they serve (each key read at its
    // first touch), so they are named, not held against readiness
    let warming: Vec<String> = namespaces
        .values()
        .filter(|n| n.sync().warming())
        .map(|n| n.sync().name().to_owned())
        .collect();
    let mut body = if unready.is_empty() {
        serde_json::json!({"status": "ready"})
    } else {
        serde_json::json!({"status": "degraded", "namespaces": unready})
    };
    if !answering.is_empty() {
        body["degraded"] = answering.into();
    }
    if !warming.is_empty() {
        body["warming"] = warming.into();
    }
    Ok(if unready.is_empty() {
        Json(body).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
    })
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let namespaces = state.namespaces();
    let engines: Vec<&swin_sync::NamespaceSync> =
        namespaces.values().map(|n| n.sync().as_ref()).collect();
    // each concurrency namespace's slots in flight, and the reservations open in each
    // namespace this node has reserved in, asked of their stores together
    let now = swin_sync::now();
    let live = futures_util::future::join_all(
        namespaces
            .iter()
            .filter(|(name, n)| n.concurrency().is_some() || state.metrics.reserved_in(name))
            .map(|(name, n)| async move {
                let live = match n.concurrency() {
                    Some(_) => n.leases().in_flight(now).await,
                    None => n.reservations().open_count(now).await,
                };
                let live = match live {
                    Ok(live) => Some(live),
                    Err(e) => {
                        tracing::debug!(namespace = %name, cause = %e, "leases in flight: no answer");
                        None
                    }
                };
                live.map(|l| (n.concurrency().is_some(), name.to_string(), l))
            }),
    )
    .await;
    let (in_flight, open): (Vec<_>, Vec<_>) = live.into_iter().flatten().partition(|l| l.0);
    let strip = |v: Vec<(bool, String, u64)>| -> Vec<(String, u64)> {
        v.into_iter().map(|(_, n, l)| (n, l)).collect()
    };
    let mut body = state
        .metrics
        .render(&engines, &strip(in_flight), &strip(open));
    if let Some(dir) = &state.data_dir {
        body.push_str(&crate::metrics::spool_gauge(swin::spool::files(dir).len()));
    }
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body)
}
