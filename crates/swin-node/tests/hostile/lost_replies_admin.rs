//! Replies lost after the store applied an operator's write: a sync asked for
//! (`POST /v1/namespaces/{ns}/sync`) whose push the store took, and a key's reset
//! (`DELETE /v1/namespaces/{ns}/keys/{key}`) the store made. Each is answered 503
//! saying the outcome is unknown, never "nothing was changed"; sent again, the push
//! counts once and the reset resets once. On PostgreSQL and Redis, with the store's
//! exact counts.

use std::collections::BTreeMap;

use swin_testkit::cluster::{Node, TestStore};
use swin_testkit::Relay;

use super::support::{node_in, post};

/// `ns`, counted on the node and pushed only when asked (its period is an hour).
fn config(section: &str) -> String {
    format!(
        "store_timeout = 1\nanswer_timeout = 0.5\n{section}\n[[namespaces]]\nname = \"ns\"\n\
         window_sizes = [86400]\nsync_rate = 3600\nstore = \"main\"\n"
    )
}

/// The SHA1 Redis knows a script of the store by (its `EVALSHA`s carry it).
fn sha(script: &str) -> Vec<u8> {
    redis::Script::new(script).get_hash().as_bytes().to_vec()
}

async fn node_via(store: &TestStore) -> (tempfile::TempDir, Relay, Node) {
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section_via(&relay)));
    (dir, relay, node)
}

fn counts(items: &[(&str, f64)]) -> BTreeMap<String, f64> {
    items.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
}

/// The keys of `ns` the store counts anything for (a reset key's hash on Redis keeps
/// the nodes' push records, and reads as 0).
async fn counted(store: &TestStore) -> BTreeMap<String, f64> {
    let mut totals = store.totals("ns").await;
    totals.retain(|_, v| *v != 0.0);
    totals
}

/// A 503 of a store failure whose message says the outcome is unknown, never that
/// nothing was changed.
fn unknown(s: u16, v: &serde_json::Value) {
    assert_eq!(s, 503, "{v}");
    let code = v["error"]["code"].as_str().unwrap_or_default();
    assert!(code.starts_with("store_"), "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("nothing was changed"), "{v}");
    assert!(message.contains("is unknown"), "{v}");
}

async fn a_sync_whose_push_reply_is_lost_is_unknown_and_counts_once(store: TestStore) {
    let (_dir, relay, node) = node_via(&store).await;
    let c = reqwest::Client::new();
    super::support::increment(&c, &node.base, "ns", "k", 5).await;
    match store.url.starts_with("redis") {
        true => relay.lose_reply_to(&[&sha(include_str!(
            "../../../swin-sync/src/store/redis/push.lua"
        ))]),
        // the push is one statement, prepared first: its execution (the next request
        // on the connection) is applied and its reply lost
        false => relay.lose_reply_after(&[b"SELECT * FROM up UNION ALL SELECT * FROM seen"], &[]),
    }
    let sync = format!("{}/v1/namespaces/ns/sync", node.base);
    let (s, v) = post(&c, sync.clone(), serde_json::json!({})).await;
    unknown(s, &v);
    assert_eq!(relay.lost(), 1);
    // the store took it; the push goes again under its number and counts once
    assert_eq!(counted(&store).await, counts(&[("k", 5.0)]));
    let mut last = (0, serde_json::Value::Null);
    for _ in 0..10 {
        last = post(&c, sync.clone(), serde_json::json!({})).await;
        if last.0 == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert_eq!(last.0, 200, "{}", last.1);
    assert_eq!(counted(&store).await, counts(&[("k", 5.0)]));
}

async fn a_reset_whose_reply_is_lost_is_unknown_and_resets_once(store: TestStore) {
    let (_dir, relay, node) = node_via(&store).await;
    let c = reqwest::Client::new();
    super::support::increment(&c, &node.base, "ns", "k", 3).await;
    super::support::increment(&c, &node.base, "ns", "other", 2).await;
    let sync = format!("{}/v1/namespaces/ns/sync", node.base);
    assert_eq!(post(&c, sync.clone(), serde_json::json!({})).await.0, 200);
    assert_eq!(counted(&store).await, counts(&[("k", 3.0), ("other", 2.0)]));
    match store.url.starts_with("redis") {
        true => relay.lose_reply_to(&[&sha(include_str!(
            "../../../swin-sync/src/store/redis/reset.lua"
        ))]),
        false => relay.lose_reply_after(
            &[b"DELETE FROM swin_counters WHERE namespace = $1 AND key = $2"],
            &[b"COMMIT"],
        ),
    }
    let reset = format!("{}/v1/namespaces/ns/keys/k", node.base);
    let r = c.delete(&reset).send().await.expect("delete");
    let s = r.status().as_u16();
    let v: serde_json::Value = r.json().await.expect("json");
    unknown(s, &v);
    assert_eq!(relay.lost(), 1);
    assert_eq!(counted(&store).await, counts(&[("other", 2.0)]));
    // sent again: reset once, the other key untouched
    let mut status = 0;
    for _ in 0..10 {
        status = c
            .delete(&reset)
            .send()
            .await
            .expect("delete")
            .status()
            .as_u16();
        if status < 300 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    assert!(status < 300, "{status}");
    assert_eq!(post(&c, sync, serde_json::json!({})).await.0, 200);
    assert_eq!(counted(&store).await, counts(&[("other", 2.0)]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_whose_push_reply_is_lost_is_unknown_and_counts_once_on_postgres() {
    a_sync_whose_push_reply_is_lost_is_unknown_and_counts_once(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_whose_push_reply_is_lost_is_unknown_and_counts_once_on_redis() {
    a_sync_whose_push_reply_is_lost_is_unknown_and_counts_once(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_whose_reply_is_lost_is_unknown_and_resets_once_on_postgres() {
    a_reset_whose_reply_is_lost_is_unknown_and_resets_once(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_whose_reply_is_lost_is_unknown_and_resets_once_on_redis() {
    a_reset_whose_reply_is_lost_is_unknown_and_resets_once(TestStore::redis()).await;
}
