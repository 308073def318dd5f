//! A commit's give-back where its reservation's quota or count has moved on by the time
//! it lands: strict admission's ended window whose quota already went back to the
//! store, and a periodic namespace whose reserve another node has not pushed yet. In
//! both, `given_back` says what the store gives back, exactly.

use std::time::Duration;

use swin_testkit::cluster::TestStore;

use super::budgets::{id, into_the_next_window, ns_call};
use super::support::node_in;

/// One namespace `ns` of 100,000 per 4 s window, as `mode` says.
fn config(section: &str, mode: &str) -> String {
    format!(
        "store_timeout = 1\n{section}
[[namespaces]]
name = \"ns\"
window_sizes = [4]
store = \"main\"
limits = [{{ window_size = 4, limit = 100000 }}]
{mode}
"
    )
}

async fn hit(c: &reqwest::Client, base: &str, key: &str, cost: f64) {
    let r = c
        .post(format!("{base}/v1/namespaces/ns/keys/{key}/hit"))
        .json(&serde_json::json!({ "cost": cost }))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
}

/// Strict admission: 7 hit and 100 reserved late in a window; in the next, a hit rolls
/// the key's quota to the new window (the ended one's goes back to the store), then the
/// reservation is committed at 40. The 60 not used go back in the ended window, after
/// its quota did: the store ends at 47 there (48 with the new window's hit), and the
/// answer says 60.
async fn a_strict_commit_gives_back_in_a_window_whose_quota_went_back(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let mode = "sync_rate = 0.2\nadmission = \"strict\"";
    let node = node_in(dir.path(), &config(&store.section(), mode));
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(2500).await;
    hit(&c, base, "k", 7.0).await;
    let (s, v) = ns_call(
        &c,
        base,
        "ns",
        "reserve",
        serde_json::json!({"keys": ["k"], "cost": 100}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let rid = id(&v);
    into_the_next_window(200).await;
    hit(&c, base, "k", 1.0).await;
    // the ended window's quota goes back at the engine's next ticks
    tokio::time::sleep(Duration::from_millis(800)).await;
    let commit = serde_json::json!({"reservation": rid, "cost": 40});
    let (s, v) = ns_call(&c, base, "ns", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["keys"][0]["given_back"], 60.0, "{v}");
    // the new window's unused quota goes back once the key is idle (5 s)
    tokio::time::sleep(Duration::from_millis(6000)).await;
    let totals = store.totals("ns").await;
    assert_eq!(totals.get("k").copied(), Some(48.0), "{totals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_commit_gives_back_in_a_window_whose_quota_went_back_on_redis() {
    a_strict_commit_gives_back_in_a_window_whose_quota_went_back(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_commit_gives_back_in_a_window_whose_quota_went_back_on_postgres() {
    let store = TestStore::postgres().await;
    a_strict_commit_gives_back_in_a_window_whose_quota_went_back(store).await;
}

/// A periodic namespace: 100 reserved on node A and committed at 70 on node B before A
/// pushed it. B gives back only what the store holds of the key, and says so: once both
/// have synced, the store holds 100 − `given_back`.
async fn a_commit_on_another_node_says_what_it_gave_back(store: TestStore) {
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let cfg = config(&store.section(), "sync_rate = 30");
    let (a, b) = (node_in(da.path(), &cfg), node_in(db.path(), &cfg));
    let c = reqwest::Client::new();
    // well inside one window
    into_the_next_window(300).await;
    let body = serde_json::json!({"keys": ["k"], "cost": 100});
    let (s, v) = ns_call(&c, &a.base, "ns", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let commit = serde_json::json!({"reservation": id(&v), "cost": 70});
    let (s, v) = ns_call(&c, &b.base, "ns", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    let given = v["keys"][0]["given_back"].as_f64().expect("given_back");
    for node in [&a, &b] {
        let r = c
            .post(format!("{}/v1/namespaces/ns/sync", node.base))
            .send()
            .await
            .expect("sync");
        assert!(r.status().is_success());
    }
    let totals = store.totals("ns").await;
    assert_eq!(
        totals.get("k").copied(),
        Some(100.0 - given),
        "given back {given}: {totals:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_another_node_says_what_it_gave_back_on_redis() {
    a_commit_on_another_node_says_what_it_gave_back(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_another_node_says_what_it_gave_back_on_sqlite() {
    a_commit_on_another_node_says_what_it_gave_back(TestStore::sqlite().await).await;
}
