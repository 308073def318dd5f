//! Readiness as an orchestrator reads it: the probe the Kubernetes manifests use keeps a
//! node that can answer (by its namespaces' `on_store_failure`) in the Service through a
//! store outage longer than `max(3 × sync_rate, store_timeout + 1 s)`, and holds a node
//! that has not reached its store since it started out of it.

use std::time::Duration;

use swin_testkit::cluster::within;

use super::support::{node, OwnRedis};

/// The readiness probe's path in `deploy/kubernetes/statefulset.yaml`.
fn manifest_probe() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/kubernetes/statefulset.yaml"
    );
    let text = std::fs::read_to_string(path).expect("the StatefulSet manifest");
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).expect("yaml");
    doc["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"]
        .as_str()
        .expect("a readiness probe on an HTTP path")
        .to_owned()
}

/// `store_timeout = 1` and `sync_rate = 0.5`: the bound is max(1.5 s, 2 s) = 2 s. One
/// eventual namespace and one strict one that denies while its store is away.
fn config(section: &str) -> String {
    format!(
        "store_timeout = 1\nshutdown_grace = 3\n{section}\n\
         [[namespaces]]\nname = \"api\"\nstore = \"main\"\nwindow_sizes = [60]\nsync_rate = 0.5\n\
         limits = [{{ window_size = 60, limit = 100 }}]\n\n\
         [[namespaces]]\nname = \"strict\"\nstore = \"main\"\nwindow_sizes = [60]\nsync_rate = 0.5\n\
         admission = \"strict\"\non_store_failure = \"deny\"\n\
         limits = [{{ window_size = 60, limit = 100 }}]\n"
    )
}

const BOUND: Duration = Duration::from_secs(2);

async fn get(c: &reqwest::Client, base: &str, path: &str) -> (u16, serde_json::Value) {
    let r = c.get(format!("{base}{path}")).send().await.expect("get");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

async fn hit(c: &reqwest::Client, base: &str, ns: &str) -> u16 {
    c.post(format!("{base}/v1/namespaces/{ns}/keys/k/hit"))
        .json(&serde_json::json!({}))
        .send()
        .await
        .expect("hit")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_reached_its_store_stays_ready_through_an_outage() {
    let probe = manifest_probe();
    assert_ne!(probe, "/readyz", "the manifests probe what stays ready");
    let mut own = OwnRedis::start(|s| config(&s.section()));
    let (c, base) = (reqwest::Client::new(), own.node.base.clone());
    within(Duration::from_secs(10), "ready at start", async || {
        get(&c, &base, &probe).await.0 == 200 && get(&c, &base, "/readyz").await.0 == 200
    })
    .await;
    assert_eq!(hit(&c, &base, "api").await, 200);
    assert_eq!(hit(&c, &base, "strict").await, 200);

    own.server.take().expect("running").kill(); // the outage
    let started = std::time::Instant::now();
    // past the bound the store's own readiness has given the node up…
    within(
        BOUND + Duration::from_secs(10),
        "/readyz is 503",
        async || get(&c, &base, "/readyz").await.0 == 503,
    )
    .await;
    tokio::time::sleep((BOUND + Duration::from_secs(1)).saturating_sub(started.elapsed())).await;
    assert!(started.elapsed() > BOUND);
    // …and the probe keeps it: it answers, as each namespace says for a failed store
    let (status, body) = get(&c, &base, &probe).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready", "{body}");
    let degraded: Vec<&str> = body["degraded"]
        .as_array()
        .expect("the namespaces in the outage, named")
        .iter()
        .map(|d| d["namespace"].as_str().expect("name"))
        .collect();
    assert_eq!(degraded, ["api", "strict"], "{body}");
    assert_eq!(
        hit(&c, &base, "api").await,
        200,
        "eventual: counted locally"
    );
    // strict: from the quota it holds, then as on_store_failure says (deny)
    let strict = hit(&c, &base, "strict").await;
    assert!(matches!(strict, 200 | 429), "strict: {strict}");
    // still so well past the bound
    tokio::time::sleep(2 * BOUND).await;
    assert_eq!(get(&c, &base, &probe).await.0, 200);

    own.restart();
    within(
        Duration::from_secs(15),
        "the store reached again",
        async || {
            let (status, body) = get(&c, &base, &probe).await;
            status == 200 && body.get("degraded").is_none()
        },
    )
    .await;
    assert!(own.node.terminate());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_has_not_reached_its_store_is_not_ready() {
    let probe = manifest_probe();
    let dir = tempfile::tempdir().expect("dir");
    let port = swin_testkit::free_port();
    let section = format!(
        "[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\nprefix = \"hostile\"\n"
    );
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(&section)).expect("config");
    let mut n = node(&path); // its store not started yet
    let c = reqwest::Client::new();
    // well past the bound, never reached: out of the Service
    tokio::time::sleep(BOUND + Duration::from_secs(1)).await;
    let (status, body) = get(&c, &n.base, &probe).await;
    assert_eq!(status, 503, "{body}");
    let reasons: Vec<&str> = body["namespaces"]
        .as_array()
        .expect("namespaces")
        .iter()
        .map(|d| d["reason"].as_str().expect("reason"))
        .collect();
    assert_eq!(reasons.len(), 2, "{body}");
    assert!(
        reasons
            .iter()
            .all(|r| r.starts_with("has not reached its store yet")),
        "{body}"
    );

    let server = swin_testkit::start_redis(port, dir.path());
    within(
        Duration::from_secs(15),
        "ready once the store is reached",
        async || get(&c, &n.base, &probe).await.0 == 200,
    )
    .await;
    assert!(n.terminate());
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_readiness_query_it_does_not_know_is_refused() {
    let own = OwnRedis::start(|s| config(&s.section()));
    let c = reqwest::Client::new();
    for query in ["store=sometimes", "stores=reached"] {
        let (status, body) = get(&c, &own.node.base, &format!("/readyz?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
    }
}
