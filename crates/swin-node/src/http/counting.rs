//! Counting over HTTP: `POST …/increment`, `GET /v1/namespaces/{ns}/keys/{key}` and
//! `POST /v1/increments`.

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use swin::WindowRate;

use super::error::ApiError;
use super::extract::{parse_json, ApiPath, JsonBody, RawJson};
use super::Route;
use crate::state::AppState;
use swin::error::Error;

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
) -> Result<Response, ApiError> {
    let windows = state
        .limiter
        .increment(&namespace, &key, body.value, body.window_size)
        .await?;
    let rates = KeyRates {
        namespace: &namespace,
        key: &key,
        windows: windows.into_iter().map(WindowJson::from).collect(),
    };
    Ok(rates.into_json())
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
    let Query(q) = query.map_err(|e| Error::BadRequest(e.body_text()))?;
    let windows = state
        .limiter
        .rates(&namespace, &key, q.window_size)
        .await?
        .into_iter()
        .map(WindowJson::from)
        .collect();
    let body = KeyRates {
        namespace: &namespace,
        key: &key,
        windows,
    };
    Ok(body.into_json())
}

impl KeyRates<'_> {
    /// The answer of one key: its JSON (see [`KeyRates::write_json`]).
    fn into_json(self) -> Response {
        let mut buf = Vec::with_capacity(64 + self.key.len() + 100 * self.windows.len());
        self.write_json(&mut buf);
        ([(header::CONTENT_TYPE, "application/json")], buf).into_response()
    }

    /// Writes what `serde_json` writes for this value, byte for byte, without its cost:
    /// serde_json scans every key and string for characters to escape, which was a fifth
    /// of a batch's instructions; here the keys are constant text and the two strings are
    /// scanned once and copied whole when nothing in them needs escaping.
    fn write_json(&self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(b"{\"namespace\":");
        write_json_str(buf, self.namespace);
        buf.extend_from_slice(b",\"key\":");
        write_json_str(buf, self.key);
        buf.extend_from_slice(b",\"windows\":[");
        for (i, w) in self.windows.iter().enumerate() {
            if i > 0 {
                buf.push(b',');
            }
            buf.extend_from_slice(b"{\"window_size\":");
            write_json_value(buf, &w.window_size);
            buf.extend_from_slice(b",\"window_start\":");
            write_json_value(buf, &w.window_start);
            buf.extend_from_slice(b",\"current\":");
            write_json_value(buf, &w.current);
            buf.extend_from_slice(b",\"previous\":");
            write_json_value(buf, &w.previous);
            buf.extend_from_slice(b",\"rate\":");
            write_json_value(buf, &w.rate);
            buf.push(b'}');
        }
        buf.extend_from_slice(b"]}");
    }
}

/// A JSON string: copied between quotes when nothing in it needs escaping (no control
/// character, quote or backslash), else written by serde_json.
fn write_json_str(buf: &mut Vec<u8>, s: &str) {
    if s.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        write_json_value(buf, s);
    }
}

/// A number (or anything) as serde_json writes it; writing into a `Vec` cannot fail.
fn write_json_value<T: Serialize + ?Sized>(buf: &mut Vec<u8>, v: &T) {
    let _ = serde_json::to_writer(&mut *buf, v);
}

/// `{"results": [...]}` of a batch, as serde_json would write it, in a buffer sized up
/// front (axum's `Json` starts small and regrows).
fn batch_results_json(results: &[KeyRates<'_>], capacity: usize) -> Response {
    let buf = batch_results_bytes(results, capacity);
    ([(header::CONTENT_TYPE, "application/json")], buf).into_response()
}

fn batch_results_bytes(results: &[KeyRates<'_>], capacity: usize) -> Vec<u8> {
    let mut buf = Vec::with_capacity(capacity);
    buf.extend_from_slice(b"{\"results\":[");
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        r.write_json(&mut buf);
    }
    buf.extend_from_slice(b"]}");
    buf
}

async fn increments_batch(
    State(state): State<Arc<AppState>>,
    RawJson(bytes): RawJson,
) -> Result<Response, ApiError> {
    let Some(bytes) = bytes else {
        return Err(Error::BadRequest(
            "body must be {\"increments\": [{\"namespace\": …, \"key\": …}, …]}".into(),
        )
        .into());
    };
    let body: BatchBody = parse_json(Some(&bytes))?;
    let asked: Vec<(&str, &str, Option<f64>, Option<u32>)> = body
        .increments
        .iter()
        .map(|i| (&*i.namespace, &*i.key, i.value, i.window_size))
        .collect();
    let counted = state.limiter.increments(&asked, state.max_batch).await?;
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
    Ok(batch_results_json(&results, hint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Serialize)]
    struct BatchResults<'a> {
        results: &'a [KeyRates<'a>],
    }

    fn number() -> impl Strategy<Value = f64> {
        prop_oneof![
            any::<f64>().prop_filter("finite", |x| x.is_finite()),
            (-1e6f64..1e6).prop_map(|x| x.round()),
            Just(-0.0),
            Just(0.1 + 0.2),
            Just(9_007_199_254_740_992.0),
        ]
    }

    proptest! {
        /// The hand-written answer is serde_json's, byte for byte: any strings (quotes,
        /// backslashes, control characters, any Unicode), any finite numbers.
        #[test]
        fn batch_answers_are_what_serde_json_writes(
            items in prop::collection::vec(
                (any::<String>(), any::<String>(),
                 prop::collection::vec((any::<u32>(), any::<i64>(), number(), number(), number()), 0..3)),
                0..6),
        ) {
            let rates: Vec<KeyRates> = items
                .iter()
                .map(|(ns, key, ws)| KeyRates {
                    namespace: ns,
                    key,
                    windows: ws
                        .iter()
                        .map(|&(window_size, window_start, current, previous, rate)| WindowJson {
                            window_size, window_start, current, previous, rate,
                        })
                        .collect(),
                })
                .collect();
            let expected = serde_json::to_vec(&BatchResults { results: &rates }).expect("json");
            let got = batch_results_bytes(&rates, 0);
            prop_assert_eq!(String::from_utf8(got).expect("utf-8"), String::from_utf8(expected).expect("utf-8"));
        }
    }
}
