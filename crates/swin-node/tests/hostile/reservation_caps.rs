//! Open reservations bounded: a client past `reservations_max_open_per_client` is 429
//! naming the key while other clients still reserve, a namespace past
//! `reservations_max_open` is 503 naming its key, reservations of cost 0 count like any
//! other, a refused reserve leaves nothing spent, and a commit frees its place; on
//! PostgreSQL, Redis and in a local-only namespace. Every case reads the exact count.

use std::time::Duration;

use swin_testkit::cluster::{within, Node};
use swin_testkit::TestStore;

use super::support::node_in;

/// `sync` (sync_rate 0, on the store) and `local` (local only), each 1,000 a day per key,
/// at most 6 reservations open and 4 per client.
fn config(section: &str) -> String {
    let ns = |name: &str, sync: &str| {
        format!(
            "
[[namespaces]]
name = \"{name}\"
window_sizes = [86400]
{sync}
limits = [{{ window_size = 86400, limit = 1000 }}]
reservations_max_open = 6
reservations_max_open_per_client = 4
"
        )
    };
    format!(
        "trusted_proxies = [\"127.0.0.1/32\", \"::1/128\"]\n{section}{}{}",
        ns("sync", "sync_rate = 0\nstore = \"main\""),
        ns("local", "sync_rate = -1"),
    )
}

/// A reserve of `cost` on `key` by the client at `from` (its `X-Forwarded-For`).
async fn reserve(
    c: &reqwest::Client,
    base: &str,
    ns: &str,
    from: &str,
    cost: f64,
) -> (u16, serde_json::Value) {
    let r = c
        .post(format!("{base}/v1/namespaces/{ns}/keys/k/reserve"))
        .header("x-forwarded-for", from)
        .json(&serde_json::json!({ "cost": cost, "ttl": 600 }))
        .send()
        .await
        .expect("send");
    (r.status().as_u16(), r.json().await.expect("json"))
}

/// What the node counts of `k` in `ns` today (its view: the store's for `sync`).
async fn counted(c: &reqwest::Client, base: &str, ns: &str) -> f64 {
    let url = format!("{base}/v1/namespaces/{ns}/keys/k?window_size=86400");
    let v: serde_json::Value = c
        .get(url)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    v["windows"][0]["current"].as_f64().unwrap_or(0.0)
}

async fn caps_hold(node: &Node, store: &TestStore, ns: &str) {
    let c = reqwest::Client::new();
    let base = node.base.as_str();
    let (a, b, z) = ("10.0.0.1", "10.0.0.2", "10.0.0.3");
    let mut held = Vec::new();
    for _ in 0..4 {
        let (s, v) = reserve(&c, base, ns, a, 0.0).await;
        assert_eq!(s, 200, "{ns}: {v}");
        held.push(v["reservation"].as_str().expect("id").to_owned());
    }
    for cost in [0.0, 10.0] {
        let (s, v) = reserve(&c, base, ns, a, cost).await;
        assert_eq!(s, 429, "{ns}: a fifth of one client's: {v}");
        assert_eq!(v["error"]["code"], "exhausted", "{ns}: {v}");
        let m = v["error"]["message"].as_str().expect("message");
        assert!(m.contains("reservations_max_open_per_client"), "{ns}: {m}");
    }
    let multi = c
        .post(format!("{base}/v1/namespaces/{ns}/reserve"))
        .header("x-forwarded-for", a)
        .json(&serde_json::json!({ "keys": ["k", "j"], "cost": 1 }))
        .send()
        .await
        .expect("send");
    assert_eq!(multi.status().as_u16(), 429, "{ns}: over several keys");
    for _ in 0..2 {
        let (s, v) = reserve(&c, base, ns, b, 5.0).await;
        assert_eq!(s, 200, "{ns}: another client: {v}");
    }
    let (s, v) = reserve(&c, base, ns, z, 0.0).await;
    assert_eq!(s, 503, "{ns}: the namespace's seventh: {v}");
    assert_eq!(v["error"]["code"], "unavailable", "{ns}: {v}");
    let m = v["error"]["message"].as_str().expect("message");
    assert!(m.contains("reservations_max_open"), "{ns}: {m}");
    // a commit frees its place, for its client and in the namespace
    let commit = c
        .post(format!("{base}/v1/namespaces/{ns}/keys/k/commit"))
        .json(&serde_json::json!({ "reservation": held[0], "cost": 0 }))
        .send()
        .await
        .expect("send");
    assert_eq!(commit.status().as_u16(), 200, "{ns}: commit");
    let (s, v) = reserve(&c, base, ns, a, 0.0).await;
    assert_eq!(s, 200, "{ns}: a's place again: {v}");
    // what the refused reserves spent is given back: b's 10 alone
    within(
        Duration::from_secs(10),
        "the refused estimates given back",
        async || counted(&c, base, ns).await == 10.0,
    )
    .await;
    if ns == "sync" {
        let stored = store.totals(ns).await.get("k").copied().unwrap_or(0.0);
        assert_eq!(stored, 10.0, "the store holds b's reservations only");
        let open = store.store.open_reservations(ns, swin_sync::now()).await;
        assert_eq!(open.expect("open"), 6);
    }
}

async fn each_namespace(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section()));
    for ns in ["sync", "local"] {
        caps_hold(&node, &store, ns).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_capped_per_client_and_namespace_on_redis() {
    each_namespace(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_are_capped_per_client_and_namespace_on_postgres() {
    each_namespace(TestStore::postgres().await).await;
}
