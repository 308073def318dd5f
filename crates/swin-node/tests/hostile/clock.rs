//! One clock for the cluster: two nodes on one Redis, one 40 s ahead of it and one 40 s
//! behind (Debian's libfaketime), decide in the store's time. Leases never exceed the
//! limit (the node ahead deleted the other's leases as lapsed: 10 held under a limit of
//! 5), and a synchronous fixed window admits exactly its limit across both (each node
//! counted in a window of its own: twice the limit).

use std::path::Path;
use std::time::Duration;

use swin_testkit::cluster::{key_call, metric_value, metrics_text, Node, TestStore};

/// Debian's libfaketime (package `faketime`), multi-threaded build.
fn libfaketime() -> String {
    swin_testkit::cluster::libfaketime()
        .expect("Debian's faketime installed (scripts/test installs it)")
}

/// A node whose wall clock is `skew` (`+40s`, `-40s`) off; its monotonic clock (tokio's
/// timers) is left alone.
fn skewed_node(config: &Path, skew: &str) -> Node {
    swin_testkit::cluster::use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let lib = libfaketime();
    Node::spawn_with_env(
        config,
        &[
            ("LD_PRELOAD", lib.as_str()),
            ("FAKETIME", skew),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ],
    )
}

const LIMIT: usize = 5;

fn config(store: &TestStore) -> String {
    format!(
        "{}
[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = {LIMIT}
lease_ttl = 30
sync_rate = 0.2
store = \"main\"

[[namespaces]]
name = \"api\"
window_sizes = [60]
sync_rate = 0
store = \"main\"
limits = [{{ window_size = 60, limit = 10 }}]
algorithm = \"fixed_window\"
",
        store.section()
    )
}

/// The store's time (Redis TIME), ms.
async fn store_ms() -> i64 {
    let client = redis::Client::open(swin_testkit::redis_url()).expect("url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut c).await.expect("TIME");
    secs * 1_000 + micros / 1_000
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_40_seconds_off_decide_in_the_stores_time() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(&store)).expect("config");
    let ahead = skewed_node(&path, "+40s");
    let behind = skewed_node(&path, "-40s");
    let c = reqwest::Client::new();

    // leases: acquires alternate between the nodes; never more than the limit
    let mut granted = 0;
    for i in 0..(3 * LIMIT) {
        let node = if i % 2 == 0 { &ahead } else { &behind };
        let (s, v) = key_call(
            &c,
            &node.base,
            "slots",
            "k",
            "acquire",
            serde_json::json!({}),
        )
        .await;
        match s {
            200 => granted += 1,
            429 => {}
            other => panic!("{other}: {v}"),
        }
    }
    assert_eq!(granted, LIMIT, "leases granted across the two nodes");

    // a synchronous fixed window: exactly its limit across both, started away from a
    // minute's end by the store's clock
    let into = store_ms().await % 60_000;
    if into > 50_000 {
        tokio::time::sleep(Duration::from_millis((61_000 - into) as u64)).await;
    }
    let mut admitted = 0;
    for i in 0..40 {
        let node = if i % 2 == 0 { &ahead } else { &behind };
        let r = c
            .post(format!("{}/v1/namespaces/api/keys/k/hit", node.base))
            .send()
            .await
            .expect("hit");
        match r.status().as_u16() {
            200 => admitted += 1,
            429 => {}
            other => panic!("{other}"),
        }
    }
    assert_eq!(admitted, 10, "hits admitted across the two nodes");
    let stored: f64 = store.totals("api").await.values().sum();
    assert_eq!(
        stored, 10.0,
        "one window in the store, holding exactly the admitted"
    );

    // each node measured its clock against the store's
    for (node, offset) in [(&ahead, -40.0), (&behind, 40.0)] {
        let text = metrics_text(&c, &node.base).await;
        let measured = metric_value(&text, "swin_clock_offset_seconds").expect("the gauge");
        assert!((measured - offset).abs() < 1.0, "{measured} for {offset}");
        assert_eq!(metric_value(&text, "swin_clock_offset_exceeded"), Some(1.0));
    }
}
