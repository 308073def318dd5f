//! Counting over HTTP: `POST …/increment`, `GET /v1/namespaces/{ns}/keys/{key}` and
//! `POST /v1/increments`.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Json;
use serde::{Deserialize, Serialize};
use swin_core::WindowRate;

use super::extract::{parse_json, ApiPath, JsonBody, RawJson};
use super::Route;
use crate::counting::{increment_all, increment_key, Item};
use crate::error::Error;
use crate::input::{check_key, check_value};
use crate::state::{AppState, Namespace};
use swin_sync::now;

pub(super) fn routes() -> Vec<Route> {
    vec![
        Route::new(
            "POST",
            "/v1/namespaces/{namespace}/keys/{key}/increment",
            post(increment),
        ),
        Route::new(
            "GET",
            "/v1/namespaces/{namespace}/keys/{key}",
            get(read_key),
        ),
        Route::new("POST", "/v1/increments", post(increments_batch)),
    ]
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

async fn increment(
    State(state): State<Arc<AppState>>,
    ApiPath((namespace, key)): ApiPath<(String, String)>,
    JsonBody(body): JsonBody<IncrementBody>,
) -> Result<Response, Error> {
    check_key(&key)?;
    let ns = state.namespace(&namespace)?;
    let value = check_value(body.value, &ns)?;
    let windows = increment_key(&ns, &key, value, body.window_size, now()).await?;
    state.metrics.increments(&namespace, 1);
    Ok(Json(KeyRates {
        namespace: &namespace,
        key: &key,
        windows: windows.into_iter().map(WindowJson::from).collect(),
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
) -> Result<Response, Error> {
    let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
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

async fn increments_batch(
    State(state): State<Arc<AppState>>,
    RawJson(bytes): RawJson,
) -> Result<Response, Error> {
    let Some(bytes) = bytes else {
        return Err(Error::BadRequest(
            "body must be {\"increments\": [{\"namespace\": …, \"key\": …}, …]}".into(),
        ));
    };
    let body: BatchBody = parse_json(Some(&bytes))?;
    if body.increments.len() > state.max_batch {
        return Err(Error::BadRequest(format!(
            "increments must hold at most {} items (max_batch), got {}",
            state.max_batch,
            body.increments.len()
        )));
    }
    // Validate everything first: a bad item rejects the batch before anything is
    // counted. Namespaces are resolved once per distinct name, not once per item.
    let mut used: Vec<Arc<Namespace>> = Vec::new();
    let mut which = Vec::with_capacity(body.increments.len());
    let mut values = Vec::with_capacity(body.increments.len());
    for (i, item) in body.increments.iter().enumerate() {
        let at = |e: Error| e.at(&format!("increments[{i}]"));
        check_key(&item.key).map_err(at)?;
        let idx = match used.iter().position(|n| n.sync.name() == item.namespace) {
            Some(idx) => idx,
            None => {
                used.push(state.namespace(&item.namespace)?);
                used.len() - 1
            }
        };
        values.push(check_value(item.value, &used[idx]).map_err(at)?);
        if let Some(s) = item.window_size {
            used[idx].sync.counters().table(s)?;
        }
        which.push(idx);
    }
    let items: Vec<Item> = body
        .increments
        .iter()
        .zip(&which)
        .zip(&values)
        .map(|((item, &idx), &value)| Item {
            ns: &used[idx],
            key: &item.key,
            value,
            window_size: item.window_size,
        })
        .collect();
    let counted = increment_all(&items, now())
        .await
        .map_err(|(i, e)| e.at(&format!("increments[{i}]")))?;
    let mut per_namespace = vec![0u64; used.len()];
    for &idx in &which {
        per_namespace[idx] += 1;
    }
    for (ns, n) in used.iter().zip(per_namespace) {
        state.metrics.increments(ns.sync.name(), n);
    }
    let results: Vec<KeyRates> = body
        .increments
        .iter()
        .zip(counted)
        .map(|(item, windows)| KeyRates {
            namespace: &item.namespace,
            key: &item.key,
            windows: windows.into_iter().map(WindowJson::from).collect(),
        })
        .collect();
    // about 160 bytes per window answered: one allocation instead of a growing buffer
    let hint = 32
        + results
            .iter()
            .map(|r| 64 + r.key.len() + 100 * r.windows.len())
            .sum::<usize>();
    json_response(&BatchResults { results }, hint)
}

/// Serializes into a buffer sized up front (axum's `Json` starts small and regrows).
fn json_response<T: Serialize>(value: &T, capacity: usize) -> Result<Response, Error> {
    let mut buf = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut buf, value).map_err(|e| {
        tracing::error!(cause = %e, "serialize response");
        Error::Internal
    })?;
    Ok(([(header::CONTENT_TYPE, "application/json")], buf).into_response())
}
