//! Runtime limits across node processes, on every store: a limit set on one node is held
//! by another within two sync periods (synchronous namespaces: within the 50 ms watch),
//! kept through a restart, applied to an Envoy descriptor by its counter key, gone after
//! DELETE, and lapsed after `expires_in`. Each wait prints how long it took.

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use swin_testkit::cluster::{use_node_binary, within, Node, TestStore};

/// `api`: 100 an hour per key, synced every 200 ms; `now`: the same, synchronous;
/// `edge`: Envoy's descriptors, `api_key` 5 per 90 s.
fn config(store: &TestStore, grpc_port: u16) -> String {
    format!(
        "store_timeout = 1\ngrpc_listen = \"127.0.0.1:{grpc_port}\"\n{}
[[namespaces]]
name = \"api\"
window_sizes = [3600]
sync_rate = 0.2
store = \"main\"
limits = [{{ window_size = 3600, limit = 100 }}]

[[namespaces]]
name = \"now\"
window_sizes = [3600]
sync_rate = 0
store = \"main\"
limits = [{{ window_size = 3600, limit = 100 }}]

[[namespaces]]
name = \"edge\"
sync_rate = 0.2
store = \"main\"
[[namespaces.descriptors]]
key = \"api_key\"
limits = [{{ window_size = 90, limit = 5 }}]
",
        store.section()
    )
}

struct Started {
    node: Node,
    grpc_port: u16,
}

fn start(dir: &Path, store: &TestStore, name: &str) -> Started {
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let grpc_port = swin_testkit::free_port();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config(store, grpc_port)).expect("config");
    let node = Node::spawn(&path);
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    Started { node, grpc_port }
}

/// The limit a dry run of `key` answers with on `base` (nothing spent).
async fn limit_on(c: &reqwest::Client, base: &str, ns: &str, key: &str) -> f64 {
    let r = c
        .post(format!("{base}/v1/namespaces/{ns}/keys/{key}/hit"))
        .json(&serde_json::json!({"dry_run": true}))
        .send()
        .await
        .expect("hit");
    let v: serde_json::Value = r.json().await.expect("json");
    v["limit"].as_f64().unwrap_or_else(|| panic!("{v}"))
}

async fn call(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<serde_json::Value>,
) -> serde_json::Value {
    let mut req = c.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("send");
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.expect("json")
}

/// The limit Envoy's descriptor `api_key=value` answers with on the node's gRPC port
/// (one hit spent).
async fn envoy_limit(grpc_port: u16, value: &str) -> u32 {
    let mut c = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    let r = c
        .should_rate_limit(RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "api_key".into(),
                    value: value.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        })
        .await
        .expect("should_rate_limit")
        .into_inner();
    r.statuses[0]
        .current_limit
        .as_ref()
        .expect("current limit")
        .requests_per_unit
}

const WAIT: Duration = Duration::from_secs(15);

async fn held_across_nodes(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let a = start(dir.path(), &store, "a");
    let mut b = start(dir.path(), &store, "b");
    let c = reqwest::Client::new();
    let (ab, bb) = (a.node.base.clone(), b.node.base.clone());
    // B serves the key before the change: it holds "no runtime limits" for it
    assert_eq!(limit_on(&c, &bb, "api", "t1").await, 100.0);
    assert_eq!(limit_on(&c, &bb, "now", "t1").await, 100.0);

    let three = serde_json::json!({"limits": [{"window_size": 3600, "limit": 3}]});
    let set = call(
        &c,
        reqwest::Method::PUT,
        format!("{ab}/v1/namespaces/api/keys/t1/limits"),
        Some(three.clone()),
    )
    .await;
    assert_eq!(set["source"], "override");
    assert_eq!(set["kept"], "store");
    assert_eq!(limit_on(&c, &ab, "api", "t1").await, 3.0, "at once on A");
    let took = within(WAIT, "B holds A's limit", async || {
        limit_on(&c, &bb, "api", "t1").await == 3.0
    })
    .await;
    println!(
        "{}: periodic (200 ms) B held it after {took:?}",
        store.store.kind()
    );
    call(
        &c,
        reqwest::Method::PUT,
        format!("{ab}/v1/namespaces/now/keys/t1/limits"),
        Some(three),
    )
    .await;
    let took = within(WAIT, "B holds A's limit (synchronous)", async || {
        limit_on(&c, &bb, "now", "t1").await == 3.0
    })
    .await;
    println!(
        "{}: synchronous B held it after {took:?}",
        store.store.kind()
    );
    // B decides under it: 3 hits allowed in all, the 4th denied
    for i in 0..4 {
        let r = c
            .post(format!("{bb}/v1/namespaces/now/keys/t1/hit"))
            .send()
            .await
            .expect("hit");
        assert_eq!(
            r.status().as_u16(),
            if i < 3 { 200 } else { 429 },
            "hit {i}"
        );
    }
    let read = call(
        &c,
        reqwest::Method::GET,
        format!("{bb}/v1/namespaces/api/keys/t1/limits"),
        None,
    )
    .await;
    assert_eq!(read["source"], "override");
    assert_eq!(read["set_by"], "anonymous");

    // kept through a restart: B's first answer about the key is under it
    assert!(b.node.terminate(), "B stops cleanly");
    b = start(dir.path(), &store, "b2");
    let bb = b.node.base.clone();
    assert_eq!(limit_on(&c, &bb, "api", "t1").await, 3.0, "after a restart");

    // an Envoy descriptor by its counter key
    assert_eq!(envoy_limit(b.grpc_port, "acme").await, 5, "the rule's");
    call(
        &c,
        reqwest::Method::PUT,
        format!("{ab}/v1/namespaces/edge/keys/api_key=acme/limits"),
        Some(serde_json::json!({"limits": [{"window_size": 90, "limit": 2}]})),
    )
    .await;
    within(WAIT, "B's Envoy door holds A's limit", async || {
        envoy_limit(b.grpc_port, "acme").await == 2
    })
    .await;
    assert_eq!(
        envoy_limit(b.grpc_port, "other").await,
        5,
        "other values keep the rule"
    );

    // gone after DELETE (on B), on A too
    let gone = call(
        &c,
        reqwest::Method::DELETE,
        format!("{bb}/v1/namespaces/api/keys/t1/limits"),
        None,
    )
    .await;
    assert_eq!(
        (&gone["deleted"], &gone["source"]),
        (&true.into(), &"config".into())
    );
    within(WAIT, "A drops the deleted limit", async || {
        limit_on(&c, &ab, "api", "t1").await == 100.0
    })
    .await;

    // lapses on its own: held by B before its lapse time, gone everywhere after it (a
    // B that briefly cannot read the store would also answer the config's 100, so the
    // lapse is checked after the lapse time, not by waiting for 100)
    let set = call(
        &c,
        reqwest::Method::PUT,
        format!("{ab}/v1/namespaces/api/keys/t2/limits"),
        Some(serde_json::json!({"limits": [{"window_size": 3600, "limit": 7}], "expires_in": 2})),
    )
    .await;
    let lapse = set["expires_at"].as_f64().expect("expires_at");
    within(WAIT, "B holds the lapsing limit", async || {
        limit_on(&c, &bb, "api", "t2").await == 7.0
    })
    .await;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64((lapse - now).max(0.0) + 0.2)).await;
    assert_eq!(limit_on(&c, &bb, "api", "t2").await, 100.0, "lapsed on B");
    assert_eq!(limit_on(&c, &ab, "api", "t2").await, 100.0, "lapsed on A");
    let page = call(
        &c,
        reqwest::Method::GET,
        format!("{ab}/v1/namespaces/api/limits"),
        None,
    )
    .await;
    assert_eq!(
        page["limits"],
        serde_json::json!([]),
        "none left in api: {page}"
    );
    drop(a);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_limits_on_postgres() {
    held_across_nodes(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_limits_on_redis() {
    held_across_nodes(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_limits_on_redis_cluster() {
    held_across_nodes(TestStore::redis_cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_limits_on_sqlite() {
    held_across_nodes(TestStore::sqlite().await).await;
}
