//! Strict admission over HTTP (`admission = "strict"`): `/hit` admits only from quota
//! the node reserved in the store, refunds give it back, `/v1/namespaces` and the metrics
//! show the mode, and with `on_store_failure` a store that cannot be asked either leaves
//! the decision to the local view or refuses with `store_unreachable`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use swin_node::config::Config;
use swin_node::http;
use swin_node::state::AppState;
use tower::ServiceExt;

fn config(store: &str, extra: &str) -> Config {
    let text = format!(
        "data_dir = \"{DATA_DIR}\"\n[stores.main]\n{store}\n[[namespaces]]\nname = \"api\"\nwindow_sizes = [3600]\nsync_rate = 1\nstore = \"main\"\nlimits = [{{ window_size = 3600, limit = 5 }}]\nadmission = \"strict\"\n{extra}"
    );
    Config::parse("strict.toml", &text, &|_| None).expect("config")
}

/// Where a node's spool lives: under the build's own dir (a stop spools there).
const DATA_DIR: &str = concat!(env!("CARGO_TARGET_TMPDIR"), "/strict");

/// A node of `config`, started as the daemon starts one.
async fn router(config: &Config) -> (axum::Router, Arc<AppState>) {
    let state = Arc::new(AppState::start(config).await.expect("started"));
    (http::router(state.clone()), state)
}

async fn post(
    r: &axum::Router,
    uri: &str,
    body: &str,
) -> (StatusCode, serde_json::Value, Option<String>) {
    let req = Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .expect("request");
    let resp = r.clone().oneshot(req).await.expect("response");
    let status = resp.status();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().expect("ascii").to_owned());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).expect("json"), retry)
}

async fn get(r: &axum::Router, uri: &str) -> String {
    let req = Request::builder()
        .uri(uri)
        .body(Body::empty())
        .expect("request");
    let resp = r.clone().oneshot(req).await.expect("response");
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    String::from_utf8(bytes.to_vec()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_hits_refunds_and_what_the_node_shows() {
    let config = config("kind = \"sqlite\"\nurl = \"sqlite::memory:\"", "");
    let (r, _) = router(&config).await;
    let hit = "/v1/namespaces/api/keys/k/hit";
    for i in 0..5 {
        let (status, body, _) = post(&r, hit, "").await;
        assert_eq!(status, StatusCode::OK, "hit {i}: {body}");
        assert_eq!(body["allowed"], true);
    }
    let (status, body, retry) = post(&r, hit, "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert!(retry.is_some());
    assert!(body.get("reason").is_none(), "{body}");
    // a refund gives quota back to this node: one more hit passes, then none
    let (status, body, _) = post(&r, "/v1/namespaces/api/keys/k/refund", "{\"cost\": 1}").await;
    assert_eq!(
        (status, &body["allowed"]),
        (StatusCode::OK, &serde_json::json!(true)),
        "{body}"
    );
    assert_eq!(post(&r, hit, "").await.0, StatusCode::OK);
    assert_eq!(post(&r, hit, "").await.0, StatusCode::TOO_MANY_REQUESTS);
    // a refund of what was never admitted gives nothing back
    let (_, body, _) = post(&r, "/v1/namespaces/api/keys/other/refund", "{\"cost\": 1}").await;
    assert_eq!(body["allowed"], false, "{body}");
    let list: serde_json::Value =
        serde_json::from_str(&get(&r, "/v1/namespaces").await).expect("json");
    let api = &list["namespaces"][0];
    assert_eq!(api["admission"], "strict");
    assert_eq!(api["on_store_failure"], "local");
    assert!(api["reservations"].as_u64().expect("a count") >= 1, "{api}");
    let metrics = get(&r, "/metrics").await;
    assert!(
        metrics.contains("swin_strict_admission{namespace=\"api\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("swin_reservations_total{namespace=\"api\"}"),
        "{metrics}"
    );
}

/// A Redis nobody listens on: every hold fails at once.
fn unreachable_redis() -> String {
    let port = swin_testkit::free_port();
    format!("kind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_away_denies_or_decides_locally_as_configured() {
    let section = unreachable_redis();
    let deny = config(&section, "on_store_failure = \"deny\"");
    let (r, _) = router(&deny).await;
    let (status, body, retry) = post(&r, "/v1/namespaces/api/keys/k/hit", "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["reason"], "store_unreachable", "{body}");
    assert_eq!(body["allowed"], false);
    assert!(retry.is_some_and(|s| s.parse::<u64>().expect("seconds") >= 1));

    let local = config(&section, "on_store_failure = \"local\"");
    let (r, node) = router(&local).await;
    for i in 0..5 {
        let (status, body, _) = post(&r, "/v1/namespaces/api/keys/k/hit", "").await;
        assert_eq!(status, StatusCode::OK, "hit {i}: {body}");
    }
    // decided on the local view: the limit still holds on this node
    assert_eq!(
        post(&r, "/v1/namespaces/api/keys/k/hit", "").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // and the hits it admitted wait, counted, for the store (read until a read does not
    // meet the sync's drain of the key: a read during one can see part of its hits in
    // neither half for a moment)
    swin_testkit::cluster::within(Duration::from_secs(5), "5 counted", async || {
        let w = node
            .limiter
            .rates("api", "k", Some(3600))
            .await
            .expect("rates");
        w[0].current == 5.0
    })
    .await;
}

fn gcra_config(section: &str, extra: &str) -> Config {
    let text = format!(
        "data_dir = \"{DATA_DIR}\"\n{section}\n[[namespaces]]\nname = \"api\"\nsync_rate = 1\nstore = \"main\"\nalgorithm = \"gcra\"\ngcra = {{ burst = 5, count = 5, period = \"1h\" }}\nadmission = \"strict\"\n{extra}"
    );
    Config::parse("strict.toml", &text, &|_| None).expect("config")
}

/// Two strict nodes share a GCRA bucket of 5 through Redis: together they admit the
/// burst less the unit the first grant's horizon (1 s) holds back, then that unit once
/// the horizon has passed, and nothing more; a refund gives a unit back to the node that
/// spent it; `on_store_failure = "deny"` refuses when the store cannot be asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_gcra_buckets_over_http() {
    let s = swin_testkit::TestStore::redis();
    let config = gcra_config(&s.section(), "");
    let nodes = [router(&config).await.0, router(&config).await.0];
    let hit = "/v1/namespaces/api/keys/k/hit";
    let mut admitted = 0;
    for i in 0..10 {
        let (status, body, retry) = post(&nodes[i % 2], hit, "").await;
        match status {
            StatusCode::OK => admitted += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["allowed"], false, "{body}");
                assert!(retry.is_some(), "{body}");
            }
            other => panic!("hit {i}: {other} {body}"),
        }
    }
    assert_eq!(
        admitted, 4,
        "the burst less what the first horizon holds back"
    );
    tokio::time::sleep(swin_sync::MAX_HORIZON + Duration::from_millis(100)).await;
    let mut later = Vec::new();
    for i in 0..4 {
        later.push(post(&nodes[i % 2], hit, "").await.0);
    }
    assert_eq!(
        later,
        [
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    // node 0 spent the last unit: a refund there gives it back to spend again
    let refund = "/v1/namespaces/api/keys/k/refund";
    let (_, body, _) = post(&nodes[1], refund, "{\"cost\": 1}").await;
    assert_eq!(body["allowed"], false, "node 1 holds nothing: {body}");
    let (_, body, _) = post(&nodes[0], refund, "{\"cost\": 1}").await;
    assert_eq!(body["allowed"], true, "{body}");
    assert_eq!(post(&nodes[0], hit, "").await.0, StatusCode::OK);
    assert_eq!(
        post(&nodes[0], hit, "").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // the store's TAT holds all five units, placed at their horizons' ends
    let tat = s.store.read_tats("api", &["k".into()]).await.expect("tats");
    let ahead = tat[0].tat_ns - swin_sync::now().0 * 1_000_000;
    let ei = 720 * 1_000_000_000i64;
    assert!(ahead > 4 * ei && ahead <= 5 * ei + 1_000_000_000, "{ahead}");

    let section = format!("[stores.main]\n{}", unreachable_redis());
    let (r, _) = router(&gcra_config(&section, "on_store_failure = \"deny\"")).await;
    let (status, body, _) = post(&r, hit, "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(body["reason"], "store_unreachable", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_limits_in_shadow_are_refused_on_a_strict_namespace() {
    let config = config("kind = \"sqlite\"\nurl = \"sqlite::memory:\"", "");
    let (r, _) = router(&config).await;
    let req = Request::builder()
        .method("PUT")
        .uri("/v1/namespaces/api/keys/k/limits")
        .header("content-type", "application/json")
        .body(Body::from(
            r#"{"limits":[{"window_size":3600,"limit":2,"shadow":true}]}"#,
        ))
        .expect("request");
    let resp = r.clone().oneshot(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("json");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("admission = \"eventual\""), "{message}");
    // nothing was set: the config's 5 decide
    for i in 0..5 {
        let (status, body, _) = post(&r, "/v1/namespaces/api/keys/k/hit", "").await;
        assert_eq!(status, StatusCode::OK, "hit {i}: {body}");
    }
    let (status, _, _) = post(&r, "/v1/namespaces/api/keys/k/hit", "").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}
