//! The router without a socket: routes, JSON shapes and every bad-input case, by area:
//! `decisions` (hits, refunds, dry runs, buckets, batches, forward auth), `counting`
//! (increments, reads, keys and values a client may send), `operating` (metrics, health,
//! tokens and scopes, size limits, the API description). What they share is here.

mod counting;
mod decisions;
mod leases;
mod limits;
mod operating;
mod reservations;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;

use swin_node::config::Config;
use swin_node::http;
use swin_node::state::AppState;
use tower::ServiceExt;

/// The namespaces the router tests use, as an operator would write them: `api` counts;
/// `login` allows 5 hits a minute (50 for the key `vip`); `orders` is a GCRA bucket of 3
/// a minute keyed by `X-Api-Key` for forward auth; `tiny` holds 2 counters and syncs once
/// an hour, so its unsynced hits fill it; `signed` takes negative values; `slots` allows 2
/// leases in flight per key.
const NAMESPACES: &str = r#"
trusted_proxies = ["127.0.0.1/32"]
body_limit = 4096
max_batch = 50

[stores.mem]
kind = "sqlite"
url = "sqlite::memory:"

[[namespaces]]
name = "api"
window_sizes = [1, 60]
sync_rate = -1
max_counters = 1000

[[namespaces]]
name = "login"
window_sizes = [60]
sync_rate = -1
max_counters = 1000
limits = [{ window_size = 60, limit = 5 }]
overrun = "cap"     # reservations.rs: a commit never passes the limit

[[namespaces.overrides]]
keys = ["vip"]
limits = [{ window_size = 60, limit = 50 }]

[[namespaces]]
name = "orders"
sync_rate = -1
max_counters = 1000
algorithm = "gcra"
gcra = { burst = 3, count = 3, period = "1m" }   # a token every 20 s
overrun = "cap"
key_from = "header:X-Api-Key"

[[namespaces]]
name = "tiny"
window_sizes = [1, 60]
sync_rate = 3600
store = "mem"
max_counters = 2

[[namespaces]]
name = "signed"
window_sizes = [60]
sync_rate = -1
max_counters = 1000
allow_decrements = true

[[namespaces]]
name = "slots"
algorithm = "concurrency"
limit = 2
lease_ttl = 30
sync_rate = -1
max_counters = 1000
"#;

/// The router over [`NAMESPACES`], built the way the node builds them. `tiny` has synced
/// once (its store is an in-memory SQLite), so the node is ready.
async fn router() -> axum::Router {
    router_with("").await
}

/// The same, with `more` config (an `[auth]` section) after the namespaces.
async fn router_with(more: &str) -> axum::Router {
    // the spool's dir under the build's own (a stop spools there; nothing is left
    // outside the target dir)
    let dir = concat!(env!("CARGO_TARGET_TMPDIR"), "/router");
    let text = format!("data_dir = \"{dir}\"\n{NAMESPACES}\n{more}");
    let config = Config::parse("router.toml", &text, &|_| None).expect("config");
    let state = AppState::start(&config).await.expect("started");
    // `tiny` syncs once an hour: its first sync, asked now, makes the node ready
    state.limiter.sync_now("tiny").await.expect("first sync");
    http::router(Arc::new(state))
}

async fn call(
    r: &axum::Router,
    method: &str,
    uri: &str,
    ctype: Option<&str>,
    body: &str,
) -> (StatusCode, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(c) = ctype {
        req = req.header("content-type", c);
    }
    let resp = r
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("response");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::String(
        String::from_utf8_lossy(&bytes).into(),
    ));
    (status, json)
}

const JSON: Option<&str> = Some("application/json");

type Answer = (StatusCode, serde_json::Value, [Option<String>; 3]);

/// A `/hit` call on `login`: status, body and the rate-limit headers.
async fn hit(r: &axum::Router, key: &str, body: &str) -> Answer {
    send(
        r,
        "POST",
        &format!("/v1/namespaces/login/keys/{key}/hit"),
        &[],
        body,
    )
    .await
}

/// Any call, with headers: status, body and the rate-limit headers.
async fn send(
    r: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    send_from(r, PROXY, method, uri, headers, body).await
}

/// The peer [`send`] calls from: the test config's one trusted proxy.
const PROXY: &str = "127.0.0.1:40000";

/// [`send`] from the connection peer `peer`.
async fn send_from(
    r: &axum::Router,
    peer: &str,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let peer: std::net::SocketAddr = peer.parse().expect("peer");
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .extension(axum::extract::ConnectInfo(peer));
    if !body.is_empty() {
        req = req.header("content-type", "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = r
        .clone()
        .oneshot(req.body(Body::from(body.to_owned())).expect("request"))
        .await
        .expect("response");
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let headers = [h("ratelimit-policy"), h("ratelimit"), h("retry-after")];
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).expect("json"),
        headers,
    )
}

/// The key's count in the current window of `size` on namespace `ns`.
async fn current(r: &axum::Router, ns: &str, key: &str, size: u32) -> f64 {
    window(r, ns, key, size).await["current"]
        .as_f64()
        .expect("a number, never null")
}

/// The key's window of `size` as a read answers it.
async fn window(r: &axum::Router, ns: &str, key: &str, size: u32) -> serde_json::Value {
    let (status, body) = call(
        r,
        "GET",
        &format!("/v1/namespaces/{ns}/keys/{key}?window_size={size}"),
        None,
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["windows"][0].clone()
}

/// The key's count in the current and previous windows of `size` together: the same
/// whichever side of a window's end the read falls.
async fn counted(r: &axum::Router, ns: &str, key: &str, size: u32) -> f64 {
    let w = window(r, ns, key, size).await;
    w["current"].as_f64().expect("a number") + w["previous"].as_f64().expect("a number")
}

/// Tokens `app` (count, decide), `ops` (admin) and `prom` (metrics), as hash-token prints
/// their hashes.
fn auth_section() -> String {
    let token = |name: &str, secret: &str, scopes: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = {scopes}\n",
            http::hash_token(secret.as_bytes())
        )
    };
    token("app", "app-secret", r#"["count", "decide"]"#)
        + &token("ops", "ops-secret", r#"["admin"]"#)
        + &token("prom", "prom-secret", r#"["metrics"]"#)
}

/// Status, error code and `WWW-Authenticate` of a call with `authorization` (if any).
async fn authed(
    r: &axum::Router,
    method: &str,
    uri: &str,
    authorization: Option<&str>,
) -> (StatusCode, String, Option<String>) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    let resp = r
        .clone()
        .oneshot(req.body(Body::empty()).expect("request"))
        .await
        .expect("response");
    let status = resp.status();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let code = v["error"]["code"].as_str().unwrap_or("").to_owned();
    (status, code, challenge)
}
