//! Replies lost after the store applied the write (a relay between the node and the
//! store drops the reply and cuts the connection): a reserve, an extend and a commit
//! each apply exactly once, their answers say what the store did, and a commit sent
//! again is told how the first settled the reservation, on PostgreSQL and Redis, in
//! periodic and synchronous namespaces. Each asserts the store's exact count.

use std::time::Duration;

use swin_testkit::cluster::{metric_value, metrics_text, within, Node, TestStore};
use swin_testkit::Relay;

use super::budgets::{id, ns_call};
use super::support::node_in;

/// `periodic` (sync_rate 0.2) and `sync` (sync_rate 0), 1,000 a day per key.
fn config(section: &str) -> String {
    let ns = |name: &str, rate: &str| {
        format!(
            "
[[namespaces]]
name = \"{name}\"
window_sizes = [86400]
sync_rate = {rate}
store = \"main\"
limits = [{{ window_size = 86400, limit = 1000 }}]
"
        )
    };
    format!(
        "store_timeout = 1\nanswer_timeout = 0.5\n{section}{}{}",
        ns("periodic", "0.2"),
        ns("sync", "0"),
    )
}

/// Which write of a reservation's record to lose the reply of.
#[derive(Debug, Clone, Copy)]
enum Write {
    Open,
    Extend,
    Take,
}

/// Arms `relay` to lose the reply of the next `write` to `store`'s reservations: Redis,
/// the script call naming the operation; PostgreSQL, the `COMMIT` of the transaction
/// that made the change.
fn arm(relay: &Relay, store: &TestStore, write: Write) {
    if store.url.starts_with("redis") {
        let op: &[u8] = match write {
            Write::Open => b"\r\nopen\r\n",
            Write::Extend => b"\r\nextend\r\n",
            Write::Take => b"\r\ntake\r\n",
        };
        relay.lose_reply_to(&[b"cost-reservation", op]);
    } else {
        let statement: &[u8] = match write {
            // the purge that begins every opening's transaction (a retry that finds
            // its own record writes nothing more)
            Write::Open => b"DELETE FROM swin_cost_reservations WHERE (namespace, id)",
            Write::Extend => b"SET total = total +",
            Write::Take => b"SET ended =",
        };
        relay.lose_reply_after(&[statement], &[b"COMMIT"]);
    }
}

/// A node over `store` through a relay of its own.
async fn node_via(store: &TestStore) -> (tempfile::TempDir, Relay, Node) {
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section_via(&relay)));
    (dir, relay, node)
}

/// Sends `op` until it is not 503 (a client retrying with the same reservation id: after
/// `outcome_unknown`, or a 503 that changed nothing while the node's connections to the
/// store come back after the cuts), at most five times: its last answer.
async fn until_known(
    c: &reqwest::Client,
    node: &Node,
    ns: &str,
    op: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    for _ in 0..5 {
        let (s, v) = ns_call(c, &node.base, ns, op, body.clone()).await;
        if s != 503 {
            return (s, v);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("{op} stayed 503");
}

/// What the store holds for `key` of `ns` once the node stopped (its last push made).
pub(crate) async fn stored_after_stop(
    store: &TestStore,
    mut node: Node,
    ns: &str,
    key: &str,
) -> f64 {
    assert!(node.terminate(), "the node stops cleanly");
    store.totals(ns).await.get(key).copied().unwrap_or(0.0)
}

/// Reserve 100, the commit at 30 loses its reply: the commit applies once (given back
/// 70), a commit sent again is told how it was settled, and the store holds 30.
async fn a_commit_whose_reply_is_lost_settles_once(store: &TestStore) {
    for ns in ["periodic", "sync"] {
        let (_dir, relay, node) = node_via(store).await;
        let c = reqwest::Client::new();
        let body = serde_json::json!({"keys": ["k"], "cost": 100});
        let (s, v) = ns_call(&c, &node.base, ns, "reserve", body).await;
        assert_eq!(s, 200, "{v}");
        let rid = id(&v);
        arm(&relay, store, Write::Take);
        let commit = serde_json::json!({"reservation": rid, "cost": 30});
        let (s, v) = until_known(&c, &node, ns, "commit", commit.clone()).await;
        assert_eq!((s, relay.lost()), (200, 1), "{ns}: {v}");
        let (s, again) = ns_call(&c, &node.base, ns, "commit", commit).await;
        assert_eq!(s, 200, "{ns}: a commit sent again: {again}");
        assert_eq!(again["keys"][0]["replayed"], true, "{ns}: {again}");
        let (s, other) = ns_call(
            &c,
            &node.base,
            ns,
            "commit",
            serde_json::json!({"reservation": rid, "cost": 5}),
        )
        .await;
        assert_eq!(
            (s, other["error"]["code"].as_str()),
            (409, Some("already_committed"))
        );
        let held = stored_after_stop(store, node, ns, "k").await;
        assert_eq!(held, 30.0, "{ns}: charged once, what was used");
    }
}

/// Reserve 100, an extend of 50 loses its reply: it counts once, and a commit at 150
/// leaves 150 in the store.
async fn an_extend_whose_reply_is_lost_counts_once(store: &TestStore) {
    for ns in ["periodic", "sync"] {
        let (_dir, relay, node) = node_via(store).await;
        let c = reqwest::Client::new();
        let body = serde_json::json!({"keys": ["k"], "cost": 100});
        let (s, v) = ns_call(&c, &node.base, ns, "reserve", body).await;
        assert_eq!(s, 200, "{v}");
        let rid = id(&v);
        arm(&relay, store, Write::Extend);
        let more = serde_json::json!({"reservation": rid, "cost": 50});
        let (s, v) = ns_call(&c, &node.base, ns, "extend", more).await;
        assert_eq!((s, relay.lost()), (200, 1), "{ns}: {v}");
        assert_eq!(v["total"], 150.0, "{ns}: {v}");
        let commit = serde_json::json!({"reservation": rid, "cost": 150});
        let (s, v) = ns_call(&c, &node.base, ns, "commit", commit).await;
        assert_eq!(s, 200, "{ns}: {v}");
        let held = stored_after_stop(store, node, ns, "k").await;
        assert_eq!(held, 150.0, "{ns}: what was used, once");
    }
}

/// A reserve whose record's reply is lost is made once: it answers its reservation,
/// and its commit at 40 leaves 40.
async fn a_reserve_whose_reply_is_lost_is_made_once(store: &TestStore) {
    for ns in ["periodic", "sync"] {
        let (_dir, relay, node) = node_via(store).await;
        let c = reqwest::Client::new();
        arm(&relay, store, Write::Open);
        let body = serde_json::json!({"keys": ["k"], "cost": 100});
        let (s, v) = ns_call(&c, &node.base, ns, "reserve", body).await;
        assert_eq!((s, relay.lost()), (200, 1), "{ns}: {v}");
        let commit = serde_json::json!({"reservation": id(&v), "cost": 40});
        let (s, v) = ns_call(&c, &node.base, ns, "commit", commit).await;
        assert_eq!(s, 200, "{ns}: {v}");
        let held = stored_after_stop(store, node, ns, "k").await;
        assert_eq!(held, 40.0, "{ns}: what was used, once");
    }
}

/// Synchronous hits, one of whose round trips loses its reply after the store applied
/// it: every hit answers 200 and the store counts each once (a lost reply no longer
/// counts its hits a second time, here, as well).
async fn a_synchronous_hit_whose_reply_is_lost_counts_once(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    for i in 0..10 {
        if i == 3 {
            // the next request naming the key is its hit's round trip (a synchronous
            // namespace reads no key before it counts)
            relay.lose_reply_to(&[b"lost-reply-key"]);
        }
        let url = format!("{}/v1/namespaces/sync/keys/lost-reply-key/hit", node.base);
        let r = c.post(url).send().await.expect("hit");
        assert_eq!(r.status(), 200, "hit {i}");
    }
    assert_eq!(relay.lost(), 1, "one reply lost");
    let held = stored_after_stop(store, node, "sync", "lost-reply-key").await;
    assert_eq!(held, 10.0, "each hit once");
}

/// A commit whose every reply is lost answers 503 `outcome_unknown`; a stop before the
/// node could resolve it spools it, and the next start settles it once: the store holds
/// what was used, and the commit sent again is told how it was settled (the stop exited
/// 0 having dropped the give-back, and the store kept the reservation's total).
async fn a_commit_unresolved_at_a_stop_is_settled_once_by_the_next_start(store: &TestStore) {
    a_commit_unresolved_at_a_stop(store, async |_, _, _| {}, async |_, _| {}).await;
}

/// A reservation of 100 on `periodic`'s `k` whose commit at 81 loses every reply (503
/// `outcome_unknown`), then `before_stop` (given the node's directory, its config and
/// the node), a stop that spools the commit (exit 0), `after_stop` (given the directory
/// and the config), and a start on the first config: the commit is settled once, at 81,
/// and sent again is told how it was.
pub(super) async fn a_commit_unresolved_at_a_stop(
    store: &TestStore,
    before_stop: impl AsyncFnOnce(&std::path::Path, &str, &Node),
    after_stop: impl AsyncFnOnce(&std::path::Path, &str),
) {
    let relay = Relay::to_url(&store.url).await;
    let dir = tempfile::tempdir().expect("dir");
    let first = config(&store.section_via(&relay));
    let mut node = node_in(dir.path(), &first);
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["k"], "cost": 100});
    let (s, v) = ns_call(&c, &node.base, "periodic", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    for _ in 0..10_000 {
        arm(&relay, store, Write::Take);
    }
    let commit = serde_json::json!({"reservation": id(&v), "cost": 81});
    let (s, v) = ns_call(&c, &node.base, "periodic", "commit", commit.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    before_stop(dir.path(), &first, &node).await;
    assert!(node.terminate(), "spooled, nothing dropped: exits 0");
    relay.disarm();
    after_stop(dir.path(), &first).await;
    let node = node_in(dir.path(), &first);
    within(
        Duration::from_secs(15),
        "the spooled commit settled",
        async || store.totals("periodic").await.get("k").copied() == Some(81.0),
    )
    .await;
    let (s, v) = ns_call(&c, &node.base, "periodic", "commit", commit).await;
    assert_eq!((s, &v["keys"][0]["replayed"]), (200, &true.into()), "{v}");
    let held = stored_after_stop(store, node, "periodic", "k").await;
    assert_eq!(held, 81.0, "settled once");
}

/// An extend whose every reply is lost answers 503 `outcome_unknown`; a stop before the
/// node could resolve it spools it (exit 0: nothing owed dropped), and the next start
/// resolves it once: the store applied it, its hits stay, and a commit of what was used
/// leaves exactly that (the stop used to exit 1 having dropped it).
async fn an_extend_unresolved_at_a_stop_is_resolved_once_by_the_next_start(store: &TestStore) {
    let (dir, relay, mut node) = node_via(store).await;
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["k"], "cost": 100});
    let (s, v) = ns_call(&c, &node.base, "periodic", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let rid = id(&v);
    for _ in 0..10_000 {
        arm(&relay, store, Write::Extend);
    }
    let more = serde_json::json!({"reservation": rid, "cost": 50});
    let (s, v) = ns_call(&c, &node.base, "periodic", "extend", more).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    assert!(node.terminate(), "spooled, nothing dropped: exits 0");
    relay.disarm();
    let node = node_in(dir.path(), &config(&store.section_via(&relay)));
    let commit = serde_json::json!({"reservation": rid, "cost": 150});
    let (s, v) = ns_call(&c, &node.base, "periodic", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["estimate"], 150.0, "the extend is in the total: {v}");
    let held = stored_after_stop(store, node, "periodic", "k").await;
    assert_eq!(held, 150.0, "what was used, once");
}

/// `extend` of `ns` on `node` under the idempotency key `key`.
async fn extend_once(
    c: &reqwest::Client,
    node: &Node,
    ns: &str,
    key: &str,
    body: &serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = c
        .post(format!("{}/v1/namespaces/{ns}/extend", node.base))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .expect("extend");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or_default())
}

/// An extend whose every reply is lost answers 503 `outcome_unknown`; the client sends
/// it again under the same `Idempotency-Key` once the store answers: it is applied once
/// (by the first request's resolution or by the retry, whichever gets there first),
/// the retry answers the total with it once, it is counted once as `extended`, a commit
/// finds that total, and the store holds what was used (the retry used to extend again:
/// a total of 200 for 100 + 50).
async fn an_extend_retried_under_its_idempotency_key_is_applied_once(store: &TestStore) {
    for ns in ["periodic", "sync"] {
        let (_dir, relay, node) = node_via(store).await;
        let c = reqwest::Client::new();
        let body = serde_json::json!({"keys": ["k"], "cost": 100});
        let (s, v) = ns_call(&c, &node.base, ns, "reserve", body).await;
        assert_eq!(s, 200, "{v}");
        let rid = id(&v);
        for _ in 0..300 {
            arm(&relay, store, Write::Extend);
        }
        let more = serde_json::json!({"reservation": rid, "cost": 50});
        let (s, v) = extend_once(&c, &node, ns, "x-1", &more).await;
        assert_eq!(
            (s, v["error"]["code"].as_str()),
            (503, Some("outcome_unknown")),
            "{ns}: {v}"
        );
        relay.disarm();
        let mut answer = (0, serde_json::Value::Null);
        for _ in 0..20 {
            answer = extend_once(&c, &node, ns, "x-1", &more).await;
            if answer.0 != 503 && answer.0 != 409 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (s, v) = answer;
        assert_eq!(
            (s, &v["total"]),
            (200, &150.0.into()),
            "{ns}: the retry: {v}"
        );
        let (s, v) = extend_once(&c, &node, ns, "x-1", &more).await;
        assert_eq!((s, &v["total"]), (200, &150.0.into()), "{ns}: again: {v}");
        // counted once, by whichever request applied it
        let series =
            format!("swin_reservation_operations_total{{namespace=\"{ns}\",outcome=\"extended\"}}");
        within(Duration::from_secs(10), "the extend counted", async || {
            metric_value(&metrics_text(&c, &node.base).await, &series) == Some(1.0)
        })
        .await;
        let commit = serde_json::json!({"reservation": rid, "cost": 150});
        let (s, v) = ns_call(&c, &node.base, ns, "commit", commit).await;
        assert_eq!(
            (s, &v["estimate"]),
            (200, &150.0.into()),
            "{ns}: extended once: {v}"
        );
        let held = stored_after_stop(store, node, ns, "k").await;
        assert_eq!(held, 150.0, "{ns}: what was used, once");
    }
}

/// A reserve whose record's every reply is lost answers 503 and the node undoes it: the
/// estimate goes back at once, and the record's end, whose replies are lost too, is
/// still owed at a stop: spooled (exit 0: nothing owed dropped), done by the next start
/// (its spool file then gone, and that node stops with nothing owed either). The store
/// holds nothing for the key (the stop used to exit 1 having dropped the undo).
async fn an_undo_unresolved_at_a_stop_is_done_by_the_next_start(store: &TestStore) {
    let (dir, relay, mut node) = node_via(store).await;
    let c = reqwest::Client::new();
    // enough for every attempt until the stop (a few dozen), few enough that the relay
    // does not scan each request against thousands
    for _ in 0..300 {
        arm(&relay, store, Write::Open);
        arm(&relay, store, Write::Take);
    }
    let body = serde_json::json!({"keys": ["k"], "cost": 100, "ttl": 600});
    let (s, v) = ns_call(&c, &node.base, "periodic", "reserve", body).await;
    assert_eq!(s, 503, "{v}");
    assert!(node.terminate(), "spooled, nothing dropped: exits 0");
    assert!(
        !super::support::spool_files(dir.path()).is_empty(),
        "the undo spooled"
    );
    relay.disarm();
    let node = node_in(dir.path(), &config(&store.section_via(&relay)));
    within(
        Duration::from_secs(15),
        "the spooled undo done",
        async || super::support::spool_files(dir.path()).is_empty(),
    )
    .await;
    let held = stored_after_stop(store, node, "periodic", "k").await;
    assert_eq!(held, 0.0, "the estimate given back");
    let open = store
        .store
        .open_reservations("periodic", swin_sync::now())
        .await;
    assert_eq!(open.expect("open"), 0, "the record ended");
}

/// A commit whose every reply is lost answers 503 `outcome_unknown`; the node resolves
/// it in the background and counts it (`swin_reservation_operations_total`
/// `committed` 1), and the commit sent again is counted as `replayed`.
async fn a_commit_resolved_after_its_answer_was_lost_is_counted(store: &TestStore) {
    let (_dir, relay, node) = node_via(store).await;
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["k"], "cost": 100});
    let (s, v) = ns_call(&c, &node.base, "sync", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    for _ in 0..10_000 {
        arm(&relay, store, Write::Take);
    }
    let commit = serde_json::json!({"reservation": id(&v), "cost": 81});
    let (s, v) = ns_call(&c, &node.base, "sync", "commit", commit.clone()).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    relay.disarm();
    let (s, v) = until_known(&c, &node, "sync", "commit", commit).await;
    assert_eq!((s, &v["keys"][0]["replayed"]), (200, &true.into()), "{v}");
    let series = |outcome: &str| {
        format!("swin_reservation_operations_total{{namespace=\"sync\",outcome=\"{outcome}\"}}")
    };
    within(
        Duration::from_secs(10),
        "the resolved commit counted",
        async || {
            let text = metrics_text(&c, &node.base).await;
            metric_value(&text, &series("committed")) == Some(1.0)
        },
    )
    .await;
    let text = metrics_text(&c, &node.base).await;
    assert_eq!(
        metric_value(&text, &series("replayed")),
        Some(1.0),
        "{text}"
    );
    let held = stored_after_stop(store, node, "sync", "k").await;
    assert_eq!(held, 81.0, "settled once");
}

swin_testkit::for_stores!([postgres, redis] [
    a_commit_resolved_after_its_answer_was_lost_is_counted,
    an_undo_unresolved_at_a_stop_is_done_by_the_next_start,
    an_extend_unresolved_at_a_stop_is_resolved_once_by_the_next_start,
    an_extend_retried_under_its_idempotency_key_is_applied_once,
    a_commit_unresolved_at_a_stop_is_settled_once_by_the_next_start,
    a_synchronous_hit_whose_reply_is_lost_counts_once,
    a_commit_whose_reply_is_lost_settles_once,
    an_extend_whose_reply_is_lost_counts_once,
    a_reserve_whose_reply_is_lost_is_made_once,
]);
