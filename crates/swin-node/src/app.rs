//! The HTTP API: state shared by the handlers and the router (`app`), buildable without
//! a socket so tests can drive it directly.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{MatchedPath, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use swin_core::{UnixMs, WindowRate};
use swin_sync::NamespaceSync;

use crate::error::ApiError;
use crate::metrics::Metrics;

pub const MAX_KEY_BYTES: usize = 1024;

/// A namespace as the API serves it.
#[derive(Debug)]
pub struct Namespace {
    pub sync: Arc<NamespaceSync>,
    pub store_name: Option<String>,
    pub limits: Option<crate::limits::Limits>,
    /// Whether `/increment` takes negative values (`allow_decrements`); without it a
    /// client could lift its own limit.
    pub allow_decrements: bool,
}

pub type Namespaces = BTreeMap<String, Arc<Namespace>>;

#[derive(Debug)]
pub struct AppState {
    /// Swapped whole on reload; requests read it without a lock.
    pub namespaces: ArcSwap<Namespaces>,
    pub metrics: Metrics,
    pub body_limit: usize,
}

impl AppState {
    pub fn new(namespaces: Namespaces, body_limit: usize) -> Self {
        AppState {
            namespaces: ArcSwap::from_pointee(namespaces),
            metrics: Metrics::default(),
            body_limit,
        }
    }

    pub(crate) fn namespace(&self, name: &str) -> Result<Arc<Namespace>, ApiError> {
        self.namespaces
            .load()
            .get(name)
            .cloned()
            .ok_or_else(|| ApiError::UnknownNamespace(name.to_owned()))
    }
}

pub(crate) fn now() -> UnixMs {
    UnixMs::from_system_time(SystemTime::now())
}

pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route(
            "/v1/namespaces/{namespace}/keys/{key}/increment",
            post(increment),
        )
        .route(
            "/v1/namespaces/{namespace}/keys/{key}",
            get(read_key).delete(crate::hit::reset),
        )
        .route("/v1/hits", post(crate::hit::batch))
        .route("/v1/auth/{namespace}", any(crate::hit::auth))
        .route(
            "/v1/namespaces/{namespace}/keys/{key}/hit",
            post(crate::hit::hit),
        )
        .route(
            "/v1/namespaces/{namespace}/keys/{key}/refund",
            post(crate::hit::refund),
        )
        .route("/v1/increments", post(batch))
        .route("/v1/namespaces", get(list_namespaces))
        .route("/v1/namespaces/{namespace}/sync", post(sync_now))
        .route(
            "/healthz",
            get(|| async { Json(serde_json::json!({"status": "ok"})) }),
        )
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .fallback(|req: Request| async move {
            ApiError::NotFound(format!("{} {}", req.method(), req.uri().path()))
        })
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        // the handlers enforce the limit themselves (JSON 413), so no default cap
        .layer(axum::extract::DefaultBodyLimit::max(state.body_limit))
        .with_state(state)
}

async fn count_requests(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let resp = next.run(req).await;
    state.metrics.http_request(&route, resp.status().as_u16());
    resp
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct IncrementBody {
    value: Option<f64>,
    window_size: Option<u32>,
}

/// Borrowed from the request body where the JSON has no escapes: a batch of a thousand
/// items should not cost two thousand string allocations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchItem<'a> {
    #[serde(borrow)]
    namespace: Cow<'a, str>,
    #[serde(borrow)]
    key: Cow<'a, str>,
    value: Option<f64>,
    window_size: Option<u32>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct BatchBody<'a> {
    #[serde(borrow)]
    increments: Vec<BatchItem<'a>>,
}

#[derive(Debug, Serialize)]
pub struct KeyRates<'a> {
    namespace: &'a str,
    key: &'a str,
    windows: Vec<WindowJson>,
}

#[derive(Debug, Serialize)]
struct WindowJson {
    window_size: u32,
    window_start: i64,
    current: f64,
    previous: f64,
    rate: f64,
}

impl From<WindowRate> for WindowJson {
    fn from(r: WindowRate) -> Self {
        WindowJson {
            window_size: r.window_size,
            window_start: r.window_start,
            current: r.current,
            previous: r.previous,
            rate: r.rate,
        }
    }
}

/// `Path`, with a JSON 400 (not axum's plain text) for a segment that does not decode,
/// such as percent-encoded bytes that are not UTF-8.
#[derive(Debug)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> axum::extract::FromRequestParts<S>
    for ApiPath<T>
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiError> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(v)) => Ok(ApiPath(v)),
            Err(e) => Err(ApiError::BadRequest(format!("path: {}", e.body_text()))),
        }
    }
}

/// Keys are UTF-8 (the path extractor checked that) of 1 to [`MAX_KEY_BYTES`] bytes
/// without U+0000, which PostgreSQL's `text` cannot hold.
pub(crate) fn check_key(key: &str) -> Result<(), ApiError> {
    if key.contains('\0') {
        return Err(ApiError::InvalidKey("key must not contain U+0000".into()));
    }
    if key.is_empty() {
        return Err(ApiError::InvalidKey("key must not be empty".into()));
    }
    if key.len() > MAX_KEY_BYTES {
        return Err(ApiError::InvalidKey(format!(
            "key is {} bytes; the limit is {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    Ok(())
}

/// The body of a POST: `None` when empty, else it must be declared JSON.
pub(crate) fn json_bytes(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Option<Bytes>, ApiError> {
    let body = body.map_err(|r| match r.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::PayloadTooLarge(limit),
        _ => ApiError::BadRequest(r.body_text()),
    })?;
    if body.is_empty() {
        return Ok(None);
    }
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            let m = m.trim().to_ascii_lowercase();
            m == "application/json" || (m.starts_with("application/") && m.ends_with("+json"))
        });
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    Ok(Some(body))
}

pub(crate) fn parse_json<'a, T: Deserialize<'a> + Default>(
    body: Option<&'a Bytes>,
) -> Result<T, ApiError> {
    match body {
        None => Ok(T::default()),
        // serde would also take a struct as an array of its fields (`[1, 60]`): bodies
        // are objects, so such a body is malformed, not a shorthand
        Some(b) if b.trim_ascii_start().first() != Some(&b'{') => Err(ApiError::BadRequest(
            "malformed JSON body: must be a JSON object".into(),
        )),
        Some(b) => serde_json::from_slice(b)
            .map_err(|e| ApiError::BadRequest(format!("malformed JSON body: {e}"))),
    }
}

/// The value of an increment (1 when absent): finite, within ±2^53, and not negative
/// unless the namespace allows decrements.
fn check_value(v: Option<f64>, ns: &Namespace) -> Result<f64, ApiError> {
    let v = v.unwrap_or(1.0);
    swin_core::check_value(v)?;
    if v < 0.0 && !ns.allow_decrements {
        return Err(ApiError::InvalidValue(format!(
            "value must not be negative, got {v} (namespace {:?} does not set allow_decrements)",
            ns.sync.name()
        )));
    }
    Ok(v)
}

/// Counts one hit of `key` in one window size, or in every size of the namespace. All
/// or nothing: when a window refuses it, the windows counted before are given back.
async fn increment_key(
    ns: &Namespace,
    key: &str,
    value: f64,
    window_size: Option<u32>,
    now: UnixMs,
) -> Result<Vec<WindowJson>, ApiError> {
    let counters = ns.sync.counters();
    let sizes: Vec<u32> = match window_size {
        Some(s) => vec![s],
        None => counters.window_sizes().map(|s| s.secs()).collect(),
    };
    let mut windows = Vec::with_capacity(sizes.len());
    for (i, &s) in sizes.iter().enumerate() {
        match ns.sync.increment(key, s, value, now).await {
            Ok(r) => windows.push(r.into()),
            Err(e) => {
                give_back(ns, key, value, &sizes[..i], now).await;
                return Err(e.into());
            }
        }
    }
    Ok(windows)
}

/// Takes `value` back out of the windows of `sizes` (an increment that cannot stand).
async fn give_back(ns: &Namespace, key: &str, value: f64, sizes: &[u32], now: UnixMs) {
    for &s in sizes {
        if let Err(e) = ns.sync.increment(key, s, -value, now).await {
            // the key holds the value just counted, so its entry cannot be refused
            tracing::error!(namespace = ns.sync.name(), key, cause = %e, "could not give back an increment");
        }
    }
}

async fn increment(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let body: IncrementBody = parse_json(bytes.as_ref())?;
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let value = check_value(body.value, &ns)?;
    let windows = increment_key(&ns, &key, value, body.window_size, now()).await?;
    state.metrics.increments(&namespace, 1);
    Ok(Json(KeyRates {
        namespace: &namespace,
        key: &key,
        windows,
    })
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadQuery {
    window_size: Option<u32>,
}

async fn read_key(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    query: Result<Query<ReadQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::BadRequest(e.body_text()))?;
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let now = now();
    let counters = ns.sync.counters();
    let windows = match q.window_size {
        Some(s) => vec![counters.table(s)?.rate_tracked(&key, now).into()],
        None => counters
            .tables()
            .iter()
            .map(|t| t.rate_tracked(&key, now).into())
            .collect(),
    };
    let body = KeyRates {
        namespace: &namespace,
        key: &key,
        windows,
    };
    Ok(Json(body).into_response())
}

#[derive(Debug, Serialize)]
struct BatchResults<'a> {
    results: Vec<KeyRates<'a>>,
}

async fn batch(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = json_bytes(&headers, body, state.body_limit)?;
    let Some(bytes) = bytes else {
        return Err(ApiError::BadRequest(
            "body must be {\"increments\": [{\"namespace\": …, \"key\": …}, …]}".into(),
        ));
    };
    let body: BatchBody = parse_json(Some(&bytes))?;
    // Validate everything first: a bad item rejects the batch before anything is
    // counted. Namespaces are resolved once per distinct name, not once per item.
    let mut used: Vec<Arc<Namespace>> = Vec::new();
    let mut which = Vec::with_capacity(body.increments.len());
    for (i, item) in body.increments.iter().enumerate() {
        let at = |e: ApiError| e.at(&format!("increments[{i}]"));
        check_key(&item.key).map_err(at)?;
        let idx = match used.iter().position(|n| n.sync.name() == item.namespace) {
            Some(idx) => idx,
            None => {
                used.push(state.namespace(&item.namespace)?);
                used.len() - 1
            }
        };
        check_value(item.value, &used[idx]).map_err(at)?;
        if let Some(s) = item.window_size {
            used[idx].sync.counters().table(s)?;
        }
        which.push(idx);
    }
    let now = now();
    let mut results = Vec::with_capacity(body.increments.len());
    let mut counted = vec![0u64; used.len()];
    for (i, (item, &idx)) in body.increments.iter().zip(&which).enumerate() {
        let value = item.value.unwrap_or(1.0);
        let windows = match increment_key(&used[idx], &item.key, value, item.window_size, now).await
        {
            Ok(w) => w,
            Err(e) => {
                // all or nothing: what the items before this one counted goes back,
                // so a client that retries the batch counts it once
                for (done, &j) in body.increments[..i].iter().zip(&which) {
                    let sizes: Vec<u32> = match done.window_size {
                        Some(s) => vec![s],
                        None => used[j]
                            .sync
                            .counters()
                            .window_sizes()
                            .map(|s| s.secs())
                            .collect(),
                    };
                    give_back(&used[j], &done.key, done.value.unwrap_or(1.0), &sizes, now).await;
                }
                return Err(e.at(&format!("increments[{i}]")));
            }
        };
        counted[idx] += 1;
        results.push(KeyRates {
            namespace: &item.namespace,
            key: &item.key,
            windows,
        });
    }
    for (ns, n) in used.iter().zip(counted) {
        state.metrics.increments(ns.sync.name(), n);
    }
    // about 160 bytes per window answered: one allocation instead of a growing buffer
    let hint = 32
        + results
            .iter()
            .map(|r| 64 + r.key.len() + 100 * r.windows.len())
            .sum::<usize>();
    json_response(&BatchResults { results }, hint)
}

/// Serializes into a buffer sized up front (axum's `Json` starts small and regrows).
fn json_response<T: Serialize>(value: &T, capacity: usize) -> Result<Response, ApiError> {
    let mut buf = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut buf, value).map_err(|e| {
        tracing::error!(cause = %e, "serialize response");
        ApiError::Internal
    })?;
    Ok(([(header::CONTENT_TYPE, "application/json")], buf).into_response())
}

#[derive(Debug, Serialize)]
struct NamespaceInfo {
    name: String,
    window_sizes: Vec<u32>,
    sync_mode: &'static str,
    sync_rate: f64,
    store: Option<String>,
    /// `sliding_window`, `fixed_window` or `gcra`; none when the namespace only counts.
    algorithm: Option<&'static str>,
    counters: usize,
    buckets: usize,
    evictions: u64,
    last_sync_ms: Option<i64>,
    pending_diffs: usize,
    degraded: bool,
    degraded_reason: Option<String>,
}

fn info(ns: &Namespace) -> NamespaceInfo {
    let st = ns.sync.status();
    let mode = ns.sync.mode();
    NamespaceInfo {
        name: ns.sync.name().to_owned(),
        window_sizes: ns
            .sync
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
        store: ns.store_name.clone(),
        algorithm: ns.limits.as_ref().map(crate::limits::Limits::algorithm),
        counters: ns.sync.counters().len(),
        buckets: ns.sync.counters().buckets().len(),
        evictions: ns.sync.counters().evictions(),
        last_sync_ms: st.last_success_ms,
        pending_diffs: st.pending_diffs,
        degraded: st.degraded.is_some(),
        degraded_reason: st.degraded,
    }
}

async fn list_namespaces(State(state): State<Arc<AppState>>) -> Json<serde_json::Value> {
    let list: Vec<NamespaceInfo> = state.namespaces.load().values().map(|n| info(n)).collect();
    Json(serde_json::json!({ "namespaces": list }))
}

async fn sync_now(
    State(state): State<Arc<AppState>>,
    ApiPath(namespace): ApiPath<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let ns = state.namespace(&namespace)?;
    match ns.sync.sync_once(now()).await {
        Ok(r) => Ok(Json(serde_json::json!({
            "namespace": namespace, "pushed": r.pushed, "fetched": r.fetched, "duration_ms": r.duration_ms
        }))),
        Err(e) => {
            tracing::warn!(namespace, cause = %e, "sync on request failed");
            Err(ApiError::Unavailable(format!(
                "sync of namespace {namespace:?} failed: the store is unreachable"
            )))
        }
    }
}

/// 200 when every store-backed namespace has reached its store, recently enough to
/// answer with the cluster's counts (see `NamespaceSync::readiness`); 503 naming the
/// namespaces that have not.
async fn ready(State(state): State<Arc<AppState>>) -> Response {
    let now = now();
    let degraded: Vec<serde_json::Value> = state
        .namespaces
        .load()
        .values()
        .filter_map(|n| {
            n.sync
                .readiness(now)
                .err()
                .map(|why| serde_json::json!({"namespace": n.sync.name(), "reason": why}))
        })
        .collect();
    if degraded.is_empty() {
        Json(serde_json::json!({"status": "ready"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(serde_json::json!({"status": "degraded", "namespaces": degraded})),
        )
            .into_response()
    }
}

async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let body = state.metrics.render(&state.namespaces.load());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}
