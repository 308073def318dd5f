//! A commit on one node whose give-back finds the store short of the reservation's
//! takes (counted on another node whose push has not landed yet): the commit answers
//! what it gave back and what it still owes, and gives the rest back once the takes
//! land. The store then holds what was used, exactly, on PostgreSQL and Redis. A commit
//! whose settlement waits for the store (the key's read lost) is counted as a commit.

use std::time::Duration;

use swin_testkit::cluster::{metric_value, metrics_text, within, TestStore};
use swin_testkit::Relay;

use super::budgets::{id, ns_call};
use super::support::node_in;

/// `periodic`: a sync every 10 s, 1,000 a day per key.
fn config(section: &str) -> String {
    format!(
        "store_timeout = 1\n{section}
[[namespaces]]
name = \"periodic\"
window_sizes = [86400]
sync_rate = 10
store = \"main\"
limits = [{{ window_size = 86400, limit = 1000 }}]
"
    )
}

/// Node A reserves 100 and extends by 50 (its hits counted on A, pushed by its next
/// sync; the record in the store at once); node B commits at 20 before A's sync: the
/// store holds none of the 130 to give back. B answers what it gave and what it owes,
/// 130 in all, and once A's push lands the store holds 20.
async fn a_give_back_short_of_takes_not_in_the_store_yet_is_given_when_they_land(
    store: &TestStore,
) {
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut a = node_in(da.path(), &config(&store.section()));
    let mut b = node_in(db.path(), &config(&store.section()));
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["k"], "cost": 100});
    let (s, v) = ns_call(&c, &a.base, "periodic", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let rid = id(&v);
    let more = serde_json::json!({"reservation": rid, "cost": 50});
    let (s, v) = ns_call(&c, &a.base, "periodic", "extend", more).await;
    assert_eq!((s, &v["total"]), (200, &150.0.into()), "{v}");
    let commit = serde_json::json!({"reservation": rid, "cost": 20});
    let (s, v) = ns_call(&c, &b.base, "periodic", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    let settled = &v["keys"][0];
    let given = settled["given_back"].as_f64().expect("given_back");
    let owed = settled["owed"].as_f64().unwrap_or(0.0);
    assert_eq!(given + owed, 130.0, "given back now and owed: {v}");
    within(
        Duration::from_secs(40),
        "the store holds what was used",
        async || store.totals("periodic").await.get("k").copied() == Some(20.0),
    )
    .await;
    assert!(a.terminate(), "A stops cleanly");
    assert!(b.terminate(), "B stops cleanly, owing nothing");
    let held = store.totals("periodic").await.get("k").copied();
    assert_eq!(held, Some(20.0), "what was used, once: {v}");
}

/// A commit whose give-back cannot read the key (every reply to a request naming the
/// key lost) ends the reservation and answers 503 `outcome_unknown` (it answered
/// `store_unreachable`, which says nothing was changed), the node settling it when the
/// store answers: it is counted as committed at once (the nodes' counts equal the
/// commits made), and the store then holds what was used.
async fn a_commit_whose_settlement_waits_for_the_store_is_counted(store: &TestStore) {
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let mut node = node_in(dir.path(), &config(&store.section_via(&relay)));
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["owed-k"], "cost": 100});
    let (s, v) = ns_call(&c, &node.base, "periodic", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    for _ in 0..10_000 {
        relay.lose_reply_to(&[b"owed-k"]);
    }
    let commit = serde_json::json!({"reservation": id(&v), "cost": 40});
    let (s, v) = ns_call(&c, &node.base, "periodic", "commit", commit).await;
    relay.disarm();
    assert_eq!(s, 503, "the settlement waits for the store: {v}");
    // the reservation is ended: a store code (which says nothing changed) would have a
    // client count the commit as never made
    assert_eq!(v["error"]["code"], "outcome_unknown", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("nothing was changed"), "{v}");
    let series = "swin_reservation_operations_total{namespace=\"periodic\",outcome=\"committed\"}";
    let text = metrics_text(&c, &node.base).await;
    assert_eq!(metric_value(&text, series), Some(1.0), "{text}");
    within(
        Duration::from_secs(30),
        "the store holds what was used",
        async || store.totals("periodic").await.get("owed-k").copied() == Some(40.0),
    )
    .await;
    assert!(node.terminate(), "the node stops cleanly");
}

/// As above, but node B stops right after the commit, while its give-back still waits
/// for A's takes: it spools what it owes (exit 0: nothing dropped), and once A's push
/// has landed the next start of B gives it back: the store holds what was used (the
/// stop used to name the give-back, exit 1, and leave the store at 150).
async fn a_give_back_waiting_at_a_stop_is_given_by_the_next_start(store: &TestStore) {
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut a = node_in(da.path(), &config(&store.section()));
    let mut b = node_in(db.path(), &config(&store.section()));
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["k"], "cost": 150});
    let (s, v) = ns_call(&c, &a.base, "periodic", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let commit = serde_json::json!({"reservation": id(&v), "cost": 20});
    let (s, v) = ns_call(&c, &b.base, "periodic", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    let owed = v["keys"][0]["owed"].as_f64().unwrap_or(0.0);
    assert!(owed > 0.0, "the give-back waits for A's takes: {v}");
    assert!(b.terminate(), "B spools what it owes: exits 0");
    assert!(
        !super::support::spool_files(db.path()).is_empty(),
        "the give-back spooled"
    );
    assert!(a.terminate(), "A stops cleanly (its takes pushed)");
    let b = node_in(db.path(), &config(&store.section()));
    within(
        Duration::from_secs(30),
        "the store holds what was used",
        async || store.totals("periodic").await.get("k").copied() == Some(20.0),
    )
    .await;
    let held = super::lost_replies::stored_after_stop(store, b, "periodic", "k").await;
    assert_eq!(held, 20.0, "what was used, once");
}

/// A commit whose settlement waits for the store (every reply naming the key lost) and
/// a stop before the store answers: the settlement is spooled (exit 0: nothing
/// dropped) with the pushes the store did not confirm, and the next start settles it
/// once: the store holds what was used (the stop used to name it, exit 1, and leave
/// the key at its estimate).
async fn a_settlement_waiting_at_a_stop_is_made_by_the_next_start(store: &TestStore) {
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let mut node = node_in(dir.path(), &config(&store.section_via(&relay)));
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["owed-k"], "cost": 100});
    let (s, v) = ns_call(&c, &node.base, "periodic", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    for _ in 0..300 {
        relay.lose_reply_to(&[b"owed-k"]);
    }
    let commit = serde_json::json!({"reservation": id(&v), "cost": 40});
    let (s, v) = ns_call(&c, &node.base, "periodic", "commit", commit).await;
    assert_eq!(s, 503, "the settlement waits for the store: {v}");
    // the reservation is ended: a store code (which says nothing changed) would have a
    // client count the commit as never made
    assert_eq!(v["error"]["code"], "outcome_unknown", "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(!message.contains("nothing was changed"), "{v}");
    assert!(node.terminate(), "the settlement spooled: exits 0");
    assert!(
        !super::support::spool_files(dir.path()).is_empty(),
        "the settlement spooled"
    );
    relay.disarm();
    let node = node_in(dir.path(), &config(&store.section_via(&relay)));
    within(
        Duration::from_secs(30),
        "the store holds what was used",
        async || store.totals("periodic").await.get("owed-k").copied() == Some(40.0),
    )
    .await;
    let held = super::lost_replies::stored_after_stop(store, node, "periodic", "owed-k").await;
    assert_eq!(held, 40.0, "what was used, once");
}

swin_testkit::for_stores!([postgres, redis] [
    a_give_back_waiting_at_a_stop_is_given_by_the_next_start,
    a_settlement_waiting_at_a_stop_is_made_by_the_next_start,
    a_give_back_short_of_takes_not_in_the_store_yet_is_given_when_they_land,
    a_commit_whose_settlement_waits_for_the_store_is_counted,
]);
