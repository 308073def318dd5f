//! The router without a socket: routes, JSON shapes and every bad-input case.
//!
//! Long on purpose: every route's cases sit in one file, each test standing alone, so a
//! contract change shows up here in one place.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use std::time::Duration;

use swin_node::config::Config;
use swin_node::http;
use swin_node::state::{AppState, Namespace, Namespaces};
use swin_sync::store::SqliteStore;
use swin_sync::Store;
use tower::ServiceExt;

/// The namespaces the router tests use, as an operator would write them: `api` counts;
/// `login` allows 5 hits a minute (50 for the key `vip`); `orders` is a GCRA bucket of 3
/// a minute keyed by `X-Api-Key` for forward auth; `tiny` holds 2 counters and syncs once
/// an hour, so its unsynced hits fill it; `signed` takes negative values.
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

[[namespaces.overrides]]
keys = ["vip"]
limits = [{ window_size = 60, limit = 50 }]

[[namespaces]]
name = "orders"
sync_rate = -1
max_counters = 1000
algorithm = "gcra"
gcra = { burst = 3, count = 3, period = "1m" }   # a token every 20 s
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
"#;

/// The router over [`NAMESPACES`], built the way the node builds them. `tiny` has synced
/// once (its store is an in-memory SQLite), so the node is ready.
async fn router() -> axum::Router {
    router_with("").await
}

/// The same, with `more` config (an `[auth]` section) after the namespaces.
async fn router_with(more: &str) -> axum::Router {
    let text = format!("{NAMESPACES}\n{more}");
    let config = Config::parse("router.toml", &text, &|_| None).expect("config");
    let store = Store::Sqlite(
        SqliteStore::connect("sqlite::memory:")
            .await
            .expect("sqlite"),
    );
    store.migrate().await.expect("migrate");
    let mut ns = Namespaces::new();
    for cfg in &config.namespaces {
        let store = cfg.store.as_ref().map(|_| store.clone());
        let n = Namespace::build(cfg, store, "test".into(), Duration::from_secs(1));
        if cfg.store.is_some() {
            n.sync
                .sync_once(swin_sync::now())
                .await
                .expect("first sync");
        }
        ns.insert(cfg.name.clone(), Arc::new(n));
    }
    let state = Arc::new(AppState::for_config(&config));
    state.namespaces.store(Arc::new(ns));
    http::router(state)
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

#[tokio::test]
async fn hits_are_allowed_up_to_the_limit_then_429_with_headers() {
    let r = router().await;
    for i in 0..5 {
        let (s, v, h) = hit(&r, "alice", "").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["allowed"], true);
        assert_eq!(v["limit"], 5.0);
        assert_eq!(v["remaining"], f64::from(4 - i));
        assert_eq!(h[0].as_deref(), Some("\"60s\";q=5;w=60"));
        assert!(
            h[1].as_deref()
                .is_some_and(|x| x.starts_with(&format!("\"60s\";r={};t=", 4 - i))),
            "{h:?}"
        );
        assert_eq!(h[2], None);
    }
    let (s, v, h) = hit(&r, "alice", "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["allowed"], false);
    let retry: u64 = h[2]
        .as_deref()
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1 && (retry as f64) >= v["retry_after"].as_f64().expect("retry_after"));
    let t: u64 = h[1]
        .as_deref()
        .expect("RateLimit")
        .rsplit("t=")
        .next()
        .expect("t")
        .parse()
        .expect("t");
    assert!(retry >= t, "Retry-After {retry} earlier than t {t}");
    // denied hits are not counted; another key has its own budget; vip has fifty
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/alice", None, "").await;
    assert_eq!(v["windows"][0]["current"], 5.0);
    assert_eq!(hit(&r, "bob", "").await.0, StatusCode::OK);
    for _ in 0..10 {
        assert_eq!(hit(&r, "vip", "").await.0, StatusCode::OK);
    }
}

#[tokio::test]
async fn refunds_give_back_admitted_hits() {
    let r = router().await;
    for _ in 0..5 {
        assert_eq!(hit(&r, "dave", "").await.0, StatusCode::OK);
    }
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/dave/refund",
        JSON,
        r#"{"cost": 2}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["allowed"].clone(), v["remaining"].clone()),
        (serde_json::json!(true), serde_json::json!(2.0))
    );
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::OK);
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::OK);
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    // nothing counted, nothing to give back; never below zero
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/erin/refund",
        None,
        "",
    )
    .await;
    assert_eq!(
        (s, v["allowed"].clone()),
        (StatusCode::OK, serde_json::json!(false))
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/erin", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
    let (s, _) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/erin/refund",
        JSON,
        r#"{"cost": -1}"#,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn dry_runs_and_costs() {
    let r = router().await;
    let (s, v, _) = hit(&r, "carol", r#"{"cost": 3}"#).await;
    assert_eq!(
        (s, v["remaining"].clone()),
        (StatusCode::OK, serde_json::json!(2.0))
    );
    let (s, v, _) = hit(&r, "carol", r#"{"cost": 3, "dry_run": true}"#).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["remaining"], 2.0);
    let (s, v, _) = hit(&r, "carol", r#"{"cost": 2, "dry_run": true}"#).await;
    assert_eq!(
        (s, v["remaining"].clone()),
        (StatusCode::OK, serde_json::json!(0.0))
    );
    let (s, _, _) = hit(&r, "carol", r#"{"cost": 2}"#).await;
    assert_eq!(s, StatusCode::OK, "the dry runs counted nothing");
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/carol/hit",
        JSON,
        r#"{"cost": 6}"#,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/carol", None, "").await;
    assert_eq!(
        v["windows"][0]["current"], 5.0,
        "a refused cost counts nothing"
    );
    let (s, v) = call(&r, "POST", "/v1/namespaces/api/keys/k/hit", None, "").await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "a namespace without limits: {v}"
    );
}

#[tokio::test]
async fn gcra_buckets_spend_refund_and_say_when() {
    let r = router().await;
    let orders = |key: &str| format!("/v1/namespaces/orders/keys/{key}/hit");
    for i in 0..3 {
        let (s, v, h) = send(&r, "POST", &orders("o1"), &[], "").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["limit"], 3.0);
        assert_eq!(v["remaining"], f64::from(2 - i));
        assert_eq!(h[0].as_deref(), Some("\"gcra\";q=3;w=60"));
    }
    let (s, v, h) = send(&r, "POST", &orders("o1"), &[], "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    let retry = v["retry_after"].as_f64().expect("retry_after");
    assert!(retry > 19.0 && retry <= 20.0, "{v}");
    assert_eq!(h[2].as_deref(), Some("20"));
    assert_eq!(v["reset_after"].as_f64().map(f64::round), Some(60.0));
    // a dry run spends nothing; a refund gives one token back
    let (s, _, _) = send(&r, "POST", &orders("o1"), &[], r#"{"dry_run": true}"#).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    let (s, v) = call(&r, "POST", "/v1/namespaces/orders/keys/o1/refund", None, "").await;
    assert_eq!(
        (s, v["allowed"].clone()),
        (StatusCode::OK, serde_json::json!(true))
    );
    assert_eq!(
        send(&r, "POST", &orders("o1"), &[], "").await.0,
        StatusCode::OK
    );
    // costs are whole tokens, at most the burst
    for bad in [r#"{"cost": 1.5}"#, r#"{"cost": 4}"#, r#"{"cost": -1}"#] {
        let (s, v, _) = send(&r, "POST", &orders("o2"), &[], bad).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
}

#[tokio::test]
async fn batch_decisions_are_all_or_nothing() {
    let r = router().await;
    let both = r#"{"hits": [{"namespace": "login", "key": "b1"},
                            {"namespace": "orders", "key": "b1", "cost": 2}]}"#;
    let (s, v, h) = send(&r, "POST", "/v1/hits", &[], both).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spent"], true);
    assert_eq!(v["results"][1]["namespace"], "orders");
    assert_eq!(v["results"][1]["remaining"], 1.0);
    // the strictest (orders, 1 left) is the answer at the top
    assert_eq!(v["remaining"], 1.0);
    assert_eq!(
        h[0].as_deref(),
        Some("\"login.60s\";q=5;w=60, \"orders.gcra\";q=3;w=60")
    );
    assert!(
        h[1].as_deref()
            .is_some_and(|x| x.starts_with("\"orders.gcra\";r=1;")),
        "{h:?}"
    );
    // orders has 1 token left: a batch wanting 2 is denied and login is not counted
    let (s, v, h) = send(&r, "POST", "/v1/hits", &[], both).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(
        (v["spent"].clone(), v["allowed"].clone()),
        (false.into(), false.into())
    );
    assert_eq!(v["results"][0]["allowed"], true);
    assert!(h[2].is_some());
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/b1", None, "").await;
    assert_eq!(v["windows"][0]["current"], 1.0, "given back");
    let one = r#"{"hits": [{"namespace": "orders", "key": "b1"}]}"#;
    assert_eq!(
        send(&r, "POST", "/v1/hits", &[], one).await.0,
        StatusCode::OK
    );
    // bad batches name the hit; nothing of them stays counted
    let bad =
        r#"{"hits": [{"namespace": "login", "key": "b2"}, {"namespace": "api", "key": "x"}]}"#;
    let (s, v, _) = send(&r, "POST", "/v1/hits", &[], bad).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("hits[1]")),
        "{v}"
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/b2", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
    for body in [r#"{"hits": []}"#, "", r#"{"hits": [{"key": "k"}]}"#] {
        let (s, _) = call(&r, "POST", "/v1/hits", JSON, body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    }
}

#[tokio::test]
async fn delete_resets_a_key() {
    let r = router().await;
    for _ in 0..5 {
        hit(&r, "zed", "").await;
    }
    assert_eq!(hit(&r, "zed", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    let (s, v) = call(&r, "DELETE", "/v1/namespaces/login/keys/zed", None, "").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        serde_json::json!({"namespace": "login", "key": "zed", "reset": true})
    );
    assert_eq!(hit(&r, "zed", "").await.0, StatusCode::OK);
    let (s, _) = call(&r, "DELETE", "/v1/namespaces/nope/keys/zed", None, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn forward_auth_takes_the_key_from_a_header_or_the_client_address() {
    let r = router().await;
    let key = [("x-api-key", "team-a")];
    for _ in 0..3 {
        let (s, v, h) = send(&r, "GET", "/v1/auth/orders", &key, "").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert!(h[1].is_some());
    }
    let (s, _, h) = send(&r, "GET", "/v1/auth/orders", &key, "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert!(h[2].is_some(), "Retry-After on a denial");
    let (s, _, _) = send(&r, "POST", "/v1/auth/orders?deny_status=403", &key, "").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let other = [("x-api-key", "team-b")];
    assert_eq!(
        send(&r, "GET", "/v1/auth/orders", &other, "").await.0,
        StatusCode::OK
    );
    let (s, v, _) = send(&r, "GET", "/v1/auth/orders", &[], "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    // login limits by client address: behind the trusted proxy, the right-most
    // X-Forwarded-For entry that is not a trusted proxy, else X-Real-IP
    let fwd = [("x-forwarded-for", "203.0.113.7, 127.0.0.1")];
    for _ in 0..5 {
        assert_eq!(
            send(&r, "GET", "/v1/auth/login", &fwd, "").await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        send(
            &r,
            "GET",
            "/v1/auth/login",
            &[("x-real-ip", "203.0.113.7")],
            ""
        )
        .await
        .0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/203.0.113.7", None, "").await;
    assert_eq!(v["windows"][0]["current"], 5.0);
    // from a peer that is not a trusted proxy the headers are not believed: the peer is
    // the key, whatever it claims
    let forged = [
        ("x-forwarded-for", "203.0.113.99"),
        ("x-real-ip", "203.0.113.98"),
    ];
    for _ in 0..2 {
        let (s, _, _) = send_from(
            &r,
            "198.51.100.4:5555",
            "GET",
            "/v1/auth/login",
            &forged,
            "",
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    for key in ["203.0.113.99", "203.0.113.98"] {
        let uri = format!("/v1/namespaces/login/keys/{key}");
        let (_, v) = call(&r, "GET", &uri, None, "").await;
        assert_eq!(v["windows"][0]["current"], 0.0, "{key}");
    }
    let (_, v) = call(
        &r,
        "GET",
        "/v1/namespaces/login/keys/198.51.100.4",
        None,
        "",
    )
    .await;
    assert_eq!(v["windows"][0]["current"], 2.0);
    // a trusted proxy passing something that is not an address: no key, nothing counted
    let (s, v, _) = send(
        &r,
        "GET",
        "/v1/auth/login",
        &[("x-forwarded-for", "alice")],
        "",
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("no_key"))
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/alice", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
    for bad in [
        "/v1/auth/login?deny_status=500",
        "/v1/auth/login?cost=x",
        "/v1/auth/api",
    ] {
        let (s, _, _) = send(&r, "GET", bad, &fwd, "").await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(
        send(&r, "GET", "/v1/auth/nope", &fwd, "").await.0,
        StatusCode::NOT_FOUND
    );
}

/// method, uri, content type, body, expected status, expected error code
type Case<'a> = (
    &'a str,
    String,
    Option<&'a str>,
    &'a str,
    StatusCode,
    &'a str,
);

#[tokio::test]
async fn increment_with_an_empty_body_counts_every_window_size() {
    let r = router().await;
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/1.2.3.4/increment",
        None,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["namespace"], "api");
    assert_eq!(v["key"], "1.2.3.4");
    let w = v["windows"].as_array().expect("windows");
    assert_eq!(w.len(), 2);
    for field in ["window_size", "window_start", "current", "previous", "rate"] {
        assert!(w[0].get(field).is_some(), "{field} missing in {v}");
    }
    assert_eq!(w[1]["current"], 1.0);
}

#[tokio::test]
async fn increment_one_window_with_a_value_then_read_it() {
    let r = router().await;
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/k/increment",
        JSON,
        r#"{"value": 2.5, "window_size": 60}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["windows"][0]["current"], 2.5);
    let (s, v) = call(
        &r,
        "GET",
        "/v1/namespaces/api/keys/k?window_size=60",
        None,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["windows"][0]["current"], 2.5);
    assert_eq!(v["windows"].as_array().expect("windows").len(), 1);
}

#[tokio::test]
async fn keys_are_percent_decoded_utf8() {
    let r = router().await;
    for (path, key) in [
        ("a%2Fb", "a/b"),
        ("with%20space", "with space"),
        ("x%3Ay", "x:y"),
        ("100%25", "100%"),
        ("%D0%BA%D0%BB%D1%8E%D1%87", "ключ"),
    ] {
        let (s, v) = call(
            &r,
            "POST",
            &format!("/v1/namespaces/api/keys/{path}/increment"),
            None,
            "",
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        assert_eq!(v["key"], key);
    }
}

#[tokio::test]
async fn batch_answers_in_order() {
    let r = router().await;
    let body = r#"{"increments":[{"namespace":"api","key":"a","value":1,"window_size":60},{"namespace":"api","key":"a","value":2,"window_size":60},{"namespace":"api","key":"b"}]}"#;
    let (s, v) = call(&r, "POST", "/v1/increments", JSON, body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let res = v["results"].as_array().expect("results");
    assert_eq!(res.len(), 3);
    assert_eq!(res[1]["windows"][0]["current"], 3.0);
    assert_eq!(res[2]["key"], "b");
}

#[tokio::test]
/// A table of every bad input beside its status and error code: long because the table is.
async fn bad_input_gets_its_status_and_a_json_error() {
    let r = router().await;
    let long = "k".repeat(1025);
    let big = "x".repeat(5000);
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            "{",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"value":"1"}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"value":1e400}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"window_size":30}"#,
            StatusCode::BAD_REQUEST,
            "unknown_window_size",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"bogus":1}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            format!("/v1/namespaces/api/keys/{long}/increment"),
            None,
            "",
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            "POST",
            "/v1/namespaces/nope/keys/k/increment".into(),
            None,
            "",
            StatusCode::NOT_FOUND,
            "unknown_namespace",
        ),
        (
            "GET",
            "/v1/nothing".into(),
            None,
            "",
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "DELETE",
            "/v1/increments".into(),
            None,
            "",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            Some("text/plain"),
            "value=1",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/v1/increments".into(),
            JSON,
            &big,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "POST",
            "/v1/increments".into(),
            JSON,
            r#"{"increments":[{"namespace":"api","key":""}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            "GET",
            "/v1/namespaces/api/keys/k?window_size=abc".into(),
            None,
            "",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
    ];
    for (method, uri, ctype, body, status, code) in cases {
        let (s, v) = call(&r, method, &uri, ctype, body).await;
        assert_eq!(
            s,
            status,
            "{method} {} {body:.40}: {v}",
            &uri[..uri.len().min(60)]
        );
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // nothing of the rejected batch was counted
    let (_, v) = call(&r, "GET", "/v1/namespaces/api/keys/k", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
}

/// The exposition passes Prometheus' own linter (`promtool check metrics`: help and type
/// for every family, counter suffixes, histogram lines), before any request and after
/// traffic of every kind.
#[tokio::test]
async fn metrics_pass_promtool() {
    let r = router().await;
    let lint = |text: String| {
        use std::io::Write;
        // scripts/test sets SWIN_PROMTOOL, or leaves the one it unpacked under target/tools
        let unpacked = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/tools/prometheus/usr/bin/promtool"
        );
        let promtool = std::env::var("SWIN_PROMTOOL").unwrap_or_else(|_| {
            if std::path::Path::new(unpacked).exists() {
                unpacked.into()
            } else {
                "promtool".into()
            }
        });
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {promtool} (scripts/test provides it): {e}"));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (s, v) = call(&r, "GET", "/metrics", None, "").await;
    assert_eq!(s, StatusCode::OK);
    lint(v.as_str().expect("text").to_owned());
    call(&r, "POST", "/v1/namespaces/api/keys/k/increment", None, "").await;
    call(
        &r,
        "POST",
        "/v1/namespaces/no%22such/keys/k/increment",
        None,
        "",
    )
    .await;
    for _ in 0..4 {
        send(&r, "POST", "/v1/namespaces/orders/keys/m/hit", &[], "").await;
    }
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text").to_owned();
    assert!(text.contains("swin_sync_duration_seconds_bucket"), "{text}");
    assert!(text.contains("swin_decisions_total{"), "{text}");
    lint(text);
}

#[tokio::test]
async fn health_ready_namespaces_and_metrics() {
    let r = router().await;
    call(&r, "POST", "/v1/namespaces/api/keys/k/increment", None, "").await;
    assert_eq!(
        call(&r, "GET", "/healthz", None, "").await.0,
        StatusCode::OK
    );
    assert_eq!(call(&r, "GET", "/readyz", None, "").await.0, StatusCode::OK);
    let (s, v) = call(&r, "GET", "/v1/namespaces", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["namespaces"][0]["sync_mode"], "local");
    assert_eq!(
        v["namespaces"][0]["window_sizes"],
        serde_json::json!([1, 60])
    );
    let (s, v) = call(&r, "GET", "/metrics", None, "").await;
    assert_eq!(s, StatusCode::OK);
    let text = v.as_str().expect("text");
    assert!(
        text.contains("swin_increments_total{namespace=\"api\"} 1"),
        "{text}"
    );
    assert!(text.contains("swin_http_requests_total{route=\"/v1/namespaces/{namespace}/keys/{key}/increment\",status=\"200\"} 1"), "{text}");
    assert!(
        text.contains("swin_counters{namespace=\"api\"} 2"),
        "{text}"
    );
    // decisions and buckets
    for _ in 0..4 {
        send(&r, "POST", "/v1/namespaces/orders/keys/m/hit", &[], "").await;
    }
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text");
    for line in [
        "swin_decisions_total{namespace=\"orders\",decision=\"allowed\"} 3",
        "swin_decisions_total{namespace=\"orders\",decision=\"denied\"} 1",
        "swin_buckets{namespace=\"orders\"} 1",
        "swin_rejected_windows_total{namespace=\"orders\"} 0",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    let (_, v) = call(&r, "GET", "/v1/namespaces", None, "").await;
    let algorithms: Vec<_> = v["namespaces"]
        .as_array()
        .expect("list")
        .iter()
        .map(|n| (n["name"].clone(), n["algorithm"].clone()))
        .collect();
    assert_eq!(
        algorithms,
        vec![
            ("api".into(), serde_json::Value::Null),
            ("login".into(), "sliding_window".into()),
            ("orders".into(), "gcra".into()),
            ("signed".into(), serde_json::Value::Null),
            ("tiny".into(), serde_json::Value::Null),
        ]
    );
}

/// The key's count in the current window of `size` on namespace `ns`.
async fn current(r: &axum::Router, ns: &str, key: &str, size: u32) -> f64 {
    let (status, body) = call(
        r,
        "GET",
        &format!("/v1/namespaces/{ns}/keys/{key}?window_size={size}"),
        None,
        "",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["windows"][0]["current"]
        .as_f64()
        .expect("a number, never null")
}

#[tokio::test]
async fn keys_with_nul_are_refused_on_every_route() {
    let r = router().await;
    let routes = [
        ("POST", "/v1/namespaces/api/keys/a%00b/increment", ""),
        ("GET", "/v1/namespaces/api/keys/a%00b", ""),
        ("DELETE", "/v1/namespaces/api/keys/a%00b", ""),
        ("POST", "/v1/namespaces/login/keys/a%00b/hit", ""),
        ("POST", "/v1/namespaces/login/keys/a%00b/refund", ""),
        (
            "POST",
            "/v1/hits",
            r#"{"hits":[{"namespace":"login","key":"a\u0000b"}]}"#,
        ),
        (
            "POST",
            "/v1/increments",
            r#"{"increments":[{"namespace":"api","key":"a\u0000b"}]}"#,
        ),
    ];
    for (method, uri, body) in routes {
        let ctype = (!body.is_empty()).then_some("application/json");
        let (status, json) = call(&r, method, uri, ctype, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {json}");
        assert_eq!(
            json["error"]["code"], "invalid_key",
            "{method} {uri}: {json}"
        );
    }
}

#[tokio::test]
async fn values_that_would_leave_exact_counts_are_refused_before_counting() {
    let r = router().await;
    let inc = |value: &str| format!(r#"{{"value": {value}, "window_size": 60}}"#);
    let uri = "/v1/namespaces/api/keys/huge/increment";
    // 9007199254740993 parses to the double 2^53: refused with 2^53 itself
    for bad in [
        "1e308",
        "-1e308",
        "9007199254740994",
        "9007199254740993",
        "9007199254740992",
        "1e16",
    ] {
        let (status, json) = call(&r, "POST", uri, JSON, &inc(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {json}");
        assert_eq!(json["error"]["code"], "invalid_value", "{bad}: {json}");
    }
    // 2^52 and 2^52 − 1 make 2^53 − 1: fine; one more would reach 2^53 (and the next
    // would vanish in rounding): refused untouched
    for v in ["4503599627370496", "4503599627370495"] {
        let (status, json) = call(&r, "POST", uri, JSON, &inc(v)).await;
        assert_eq!(status, StatusCode::OK, "{json}");
    }
    let (status, json) = call(&r, "POST", uri, JSON, &inc("1")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["error"]["code"], "invalid_value");
    assert_eq!(current(&r, "api", "huge", 60).await, 9007199254740991.0);
}

#[tokio::test]
async fn negative_values_only_where_the_namespace_allows_decrements() {
    let r = router().await;
    let body = r#"{"value": -100, "window_size": 60}"#;
    let (status, json) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/k/increment",
        JSON,
        body,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["error"]["code"], "invalid_value");
    assert_eq!(current(&r, "api", "k", 60).await, 0.0);
    let batch = r#"{"increments":[{"namespace":"api","key":"k","value":1},{"namespace":"api","key":"k","value":-5}]}"#;
    let (status, json) = call(&r, "POST", "/v1/increments", JSON, batch).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("increments[1]")),
        "{json}"
    );
    assert_eq!(
        current(&r, "api", "k", 60).await,
        0.0,
        "nothing of the batch counted"
    );

    let (status, json) = call(
        &r,
        "POST",
        "/v1/namespaces/signed/keys/k/increment",
        JSON,
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    // a count stops at zero, as in every store (it answered −100)
    assert_eq!(json["windows"][0]["current"], 0.0, "{json}");
    assert_eq!(current(&r, "signed", "k", 60).await, 0.0);
}

#[tokio::test]
async fn bodies_are_json_objects_and_batches_need_a_body() {
    let r = router().await;
    for (uri, body) in [
        ("/v1/namespaces/api/keys/k/increment", "[5, 60]"),
        ("/v1/namespaces/login/keys/k/hit", "[1, false]"),
        ("/v1/namespaces/login/keys/k/refund", "[1]"),
        ("/v1/increments", r#"[[{"namespace":"api","key":"k"}]]"#),
        ("/v1/hits", r#"[[{"namespace":"login","key":"k"}], false]"#),
    ] {
        let (status, json) = call(&r, "POST", uri, JSON, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}: {json}");
    }
    assert_eq!(current(&r, "api", "k", 60).await, 0.0);
    let (status, json) = call(&r, "POST", "/v1/increments", None, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["error"]["code"], "bad_request");
}

#[tokio::test]
async fn a_batch_that_fails_part_way_leaves_nothing_counted() {
    let r = router().await;
    // /v1/hits: the unknown namespace comes after a hit that would be allowed
    let hits = r#"{"hits":[{"namespace":"login","key":"b"},{"namespace":"nope","key":"b"}]}"#;
    let (status, json) = call(&r, "POST", "/v1/hits", JSON, hits).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
    assert_eq!(current(&r, "login", "b", 60).await, 0.0);
    // a bad cost further on
    let hits =
        r#"{"hits":[{"namespace":"login","key":"b"},{"namespace":"login","key":"c","cost":9}]}"#;
    let (status, json) = call(&r, "POST", "/v1/hits", JSON, hits).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(current(&r, "login", "b", 60).await, 0.0);

    // `tiny` holds two keys per window size, every hit unsynced: fill size 60
    let one = |key: &str, size: u32| {
        format!(r#"{{"namespace":"tiny","key":"{key}","window_size":{size}}}"#)
    };
    let batch = format!(r#"{{"increments":[{},{}]}}"#, one("a", 60), one("b", 60));
    let (status, json) = call(&r, "POST", "/v1/increments", JSON, &batch).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    // a known key, then a new one the full table refuses: the first goes back out
    let batch = format!(r#"{{"increments":[{},{}]}}"#, one("a", 60), one("c", 60));
    let (status, json) = call(&r, "POST", "/v1/increments", JSON, &batch).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert_eq!(
        current(&r, "tiny", "a", 60).await,
        1.0,
        "a retry counts it once"
    );
    // every window size: size 1 has room, size 60 refuses, so size 1 gives it back
    let (status, json) = call(&r, "POST", "/v1/namespaces/tiny/keys/c/increment", None, "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    let (_, json) = call(
        &r,
        "GET",
        "/v1/namespaces/tiny/keys/c?window_size=1",
        None,
        "",
    )
    .await;
    assert_eq!(json["windows"][0]["current"], 0.0, "{json}");
}

/// A value is counted exactly as the client wrote it: serde_json's default parser can be
/// an ulp off (found by the whole-chain property), so bodies are parsed exactly.
#[tokio::test]
async fn values_are_parsed_exactly() {
    let r = router().await;
    let value = 1.2750726484814737e-227_f64;
    let body = format!(r#"{{"value": {value:e}, "window_size": 60}}"#);
    let (status, json) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/exact/increment",
        JSON,
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(
        current(&r, "api", "exact", 60).await.to_bits(),
        value.to_bits()
    );
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

/// With `[auth]`, each route needs its scope: no token or an unknown one is 401 with
/// `WWW-Authenticate: Bearer`, a token without the scope is 403, and neither counts
/// anything; health and readiness stay open. (Tables of calls and what each answers:
/// long because the tables are.)
#[tokio::test]
async fn tokens_and_scopes() {
    let r = router_with(&auth_section()).await;
    let inc = "/v1/namespaces/api/keys/k/increment";
    let app = Some("Bearer app-secret");
    let ops = Some("Bearer ops-secret");
    let prom = Some("Bearer prom-secret");
    let unauthorized = (
        StatusCode::UNAUTHORIZED,
        "unauthorized".to_owned(),
        Some("Bearer".to_owned()),
    );
    for bad in [
        None,
        Some("Bearer wrong-secret"),
        Some("Basic YXBwOmFwcC1zZWNyZXQ="),
        Some("Bearer"),
        Some("Bearer "),
        Some("app-secret"),
    ] {
        assert_eq!(authed(&r, "POST", inc, bad).await, unauthorized, "{bad:?}");
    }
    let forbidden = (StatusCode::FORBIDDEN, "forbidden".to_owned(), None);
    for (method, uri, token) in [
        ("POST", inc, ops),
        ("POST", inc, prom),
        ("GET", "/v1/namespaces/api/keys/k", ops),
        ("POST", "/v1/namespaces/login/keys/a/hit", ops),
        ("DELETE", "/v1/namespaces/api/keys/k", app),
        ("GET", "/v1/namespaces", app),
        ("POST", "/v1/namespaces/api/sync", prom),
        ("GET", "/metrics", app),
    ] {
        assert_eq!(
            authed(&r, method, uri, token).await,
            forbidden,
            "{method} {uri} {token:?}"
        );
    }
    // the scheme in any case; what the scopes allow
    for (method, uri, token) in [
        ("POST", inc, app),
        ("POST", inc, Some("bearer app-secret")),
        ("POST", "/v1/namespaces/login/keys/a/hit", app),
        ("GET", "/v1/namespaces/api/keys/k", app),
        ("GET", "/v1/namespaces", ops),
        ("GET", "/metrics", prom),
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
    ] {
        let (status, code, _) = authed(&r, method, uri, token).await;
        assert_eq!(status, StatusCode::OK, "{method} {uri} {token:?}: {code}");
    }
    // only the two allowed increments counted
    let (_, v) = {
        let req = Request::builder()
            .uri("/v1/namespaces/api/keys/k")
            .header("authorization", "Bearer app-secret")
            .body(Body::empty())
            .expect("request");
        let resp = r.clone().oneshot(req).await.expect("response");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (
            (),
            serde_json::from_slice::<serde_json::Value>(&bytes).expect("json"),
        )
    };
    assert_eq!(v["windows"][0]["current"], 2.0, "{v}");
    // an admin reset is allowed for ops
    let (status, _, _) = authed(&r, "DELETE", "/v1/namespaces/api/keys/k", ops).await;
    assert!(status.is_success(), "{status}");
    // metrics name tokens, never secrets
    let (_, text) = {
        let req = Request::builder()
            .uri("/metrics")
            .header("authorization", "Bearer prom-secret")
            .body(Body::empty())
            .expect("request");
        let resp = r.clone().oneshot(req).await.expect("response");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        ((), String::from_utf8(bytes.to_vec()).expect("utf8"))
    };
    for line in [
        "swin_auth_requests_total{token=\"app\",outcome=\"allowed\"}",
        "swin_auth_requests_total{token=\"ops\",outcome=\"forbidden\"}",
        "swin_auth_requests_total{token=\"\",outcome=\"missing\"}",
        "swin_auth_requests_total{token=\"\",outcome=\"unknown\"}",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(!text.contains("secret"), "{text}");
}

/// A declared `Content-Length` over `body_limit` is refused before a byte is read, and a
/// batch holds at most `max_batch` items (50 here) on both batch routes.
#[tokio::test]
async fn declared_lengths_and_batch_sizes_are_bounded() {
    let r = router().await;
    let req = Request::builder()
        .method("POST")
        .uri("/v1/increments")
        .header("content-type", "application/json")
        .header("content-length", "1000000000")
        .body(Body::empty())
        .expect("request");
    let resp = r.clone().oneshot(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let items = |n: usize, what: &str| {
        let one = r#"{"namespace":"api","key":"b"}"#;
        format!("{{\"{what}\":[{}]}}", vec![one; n].join(","))
    };
    for (uri, what) in [("/v1/increments", "increments"), ("/v1/hits", "hits")] {
        let (s, v) = call(&r, "POST", uri, JSON, &items(51, what)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_batch")),
            "{v}"
        );
    }
    let (s, v) = call(&r, "POST", "/v1/increments", JSON, &items(50, "increments")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let (_, v) = call(&r, "GET", "/v1/namespaces/api/keys/b", None, "").await;
    assert_eq!(
        v["windows"][0]["current"], 50.0,
        "only the batch within max_batch counted"
    );
}

/// A URI or headers past the limits: 414 and 431, each with a JSON error.
#[tokio::test]
async fn long_uris_and_large_headers_get_json_errors() {
    let r = router().await;
    let long_key = "k".repeat(9 * 1024);
    let uri = format!("/v1/namespaces/api/keys/{long_key}");
    let (s, v) = call(&r, "GET", &uri, None, "").await;
    assert_eq!(s, StatusCode::URI_TOO_LONG);
    assert_eq!(v["error"]["code"], "uri_too_long");
    let big = "x".repeat(17 * 1024);
    let (s, v, _) = send(&r, "GET", "/healthz", &[("x-big", big.as_str())], "").await;
    assert_eq!(s, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(v["error"]["code"], "headers_too_large");
}

/// `/v1/openapi.json` describes every route the router has, and nothing it lacks; every
/// route it lists is routed (not the 404 or 405 of an unknown route or method).
#[tokio::test]
async fn the_description_covers_every_route() {
    let r = router().await;
    let (s, doc) = call(&r, "GET", "/v1/openapi.json", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    let routes = http::routes();
    for (method, path) in &routes {
        let ops = paths
            .get(*path)
            .unwrap_or_else(|| panic!("{path} is not described"));
        let methods: Vec<&str> = if *method == "*" {
            vec!["get", "post", "put", "delete", "patch"]
        } else {
            vec![method]
        };
        for m in methods {
            assert!(
                ops.get(m.to_ascii_lowercase()).is_some(),
                "{m} {path} is not described"
            );
            let uri = path.replace("{namespace}", "api").replace("{key}", "k");
            let (s, v) = call(&r, &m.to_ascii_uppercase(), &uri, None, "").await;
            assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{m} {uri}");
            assert_ne!(v["error"]["code"], "not_found", "{m} {uri}: {v}");
        }
    }
    for (path, ops) in paths {
        for m in ops.as_object().expect("operations").keys() {
            let listed = routes
                .iter()
                .any(|(rm, rp)| rp == path && (*rm == "*" || rm.eq_ignore_ascii_case(m)));
            assert!(listed, "{m} {path} is described but not routed");
        }
    }
}
