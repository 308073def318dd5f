//! Operating a node over HTTP: reset a key, list namespaces, sync now, health,
//! readiness and metrics.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::ApiPath;
use super::Route;
use crate::state::AppState;
use swin::error::Error;
use swin::status::{NamespaceStatus, Synced, TopBy};

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
    state.limiter.reset(&namespace, &key).await?;
    Ok(Json(serde_json::json!({
        "namespace": namespace,
        "key": key,
        "reset": true,
    }))
    .into_response())
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
    let limiter = &state.limiter;
    let list = limiter.status();
    let top: serde_json::Map<String, serde_json::Value> = list
        .iter()
        .map(|n| {
            let keys = limiter
                .top_keys(n.name(), TopBy::Denied, UI_TOP)
                .map_or_else(
                    |_| serde_json::json!([]),
                    |t| crate::metrics::document(&t)["keys"].take(),
                );
            (n.name().to_owned(), keys)
        })
        .collect();
    (
        [(header::CACHE_CONTROL, "no-store")],
        Json(serde_json::json!({
            "now_ms": crate::metrics::document(&limiter.node_status())["now_ms"],
            "namespaces": list,
            "top_denied": top,
            "quota_streams": state.metrics.quota_streams.load(std::sync::atomic::Ordering::Relaxed),
        })),
    )
        .into_response()
}

async fn list_namespaces(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let list: Vec<NamespaceStatus> = state.limiter.status();
    Json(serde_json::json!({ "namespaces": list }))
}

async fn sync_now(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
) -> Result<Json<Synced>, ApiError> {
    Ok(Json(state.limiter.sync_now(&namespace).await?))
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
    let readiness = state.limiter.readiness(q.store == StoreReach::Reached);
    Ok(match readiness.is_ready() {
        true => Json(readiness).into_response(),
        false => (StatusCode::SERVICE_UNAVAILABLE, Json(readiness)).into_response(),
    })
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let limiter = &state.limiter;
    // each namespace's status document, made once for the scrape
    let namespaces: Vec<(String, serde_json::Value)> = limiter
        .status()
        .iter()
        .map(|n| (n.name().to_owned(), crate::metrics::document(n)))
        .collect();
    // each concurrency namespace's slots in flight, and the reservations open in each
    // namespace this node has reserved in, asked of their stores together
    let live = futures_util::future::join_all(
        namespaces
            .iter()
            .map(|(name, doc)| (name.as_str(), !doc["limit"].is_null()))
            .filter(|(name, leases)| *leases || state.metrics.reserved_in(name))
            .map(|(name, leases)| async move {
                match limiter.in_flight(name).await {
                    Ok(live) => Some((leases, name.to_owned(), live)),
                    Err(e) => {
                        tracing::debug!(namespace = %name, cause = %e, "in flight: no answer");
                        None
                    }
                }
            }),
    )
    .await;
    let (in_flight, open): (Vec<_>, Vec<_>) = live.into_iter().flatten().partition(|l| l.0);
    let strip = |v: Vec<(bool, String, u64)>| -> Vec<(String, u64)> {
        v.into_iter().map(|(_, n, l)| (n, l)).collect()
    };
    let body = state.metrics.render(
        &namespaces,
        &limiter.node_status(),
        &strip(in_flight),
        &strip(open),
    );
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body)
}
