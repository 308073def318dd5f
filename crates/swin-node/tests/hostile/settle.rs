//! A commit's give-back where its reservation's quota or count has moved on by the time
//! it lands: strict admission's ended window whose quota already went back to the
//! store, and a periodic namespace whose reserve another node has not pushed yet. In
//! both, `given_back` says what the store gives back, exactly. And what a strict
//! commit answers of the key after it: its debt past the limit, and the window that
//! ended before it.

use std::time::Duration;

use swin_testkit::cluster::{Node, TestStore};

use super::budgets::{four_seconds, id, into_the_next_window, ns_call};
use super::support::node_in;

/// One namespace `ns` of 100,000 per 4 s window, as `mode` says.
fn config(section: &str, mode: &str) -> String {
    four_seconds(section, "ns", 100_000, mode)
}

const STRICT: &str = "sync_rate = 0.2\nadmission = \"strict\"";

/// A hit (or a dry run) of `cost` on `key`: its status and answer.
async fn try_hit(
    c: &reqwest::Client,
    base: &str,
    key: &str,
    cost: f64,
    dry_run: bool,
) -> (u16, serde_json::Value) {
    let r = c
        .post(format!("{base}/v1/namespaces/ns/keys/{key}/hit"))
        .json(&serde_json::json!({ "cost": cost, "dry_run": dry_run }))
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// Two nodes of the config `cfg` (with their directories, kept while they run).
fn two_nodes(cfg: &str) -> ([tempfile::TempDir; 2], Node, Node) {
    let dirs = [0, 1].map(|_| tempfile::tempdir().expect("dir"));
    let (a, b) = (node_in(dirs[0].path(), cfg), node_in(dirs[1].path(), cfg));
    (dirs, a, b)
}

/// Reserves `cost` on key `k` of `ns`: the reservation's id.
async fn reserve(c: &reqwest::Client, base: &str, cost: f64) -> String {
    let body = serde_json::json!({"keys": ["k"], "cost": cost});
    let (s, v) = ns_call(c, base, "ns", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    id(&v)
}

/// Commits reservation `rid` at `cost`: the answer.
async fn commit(c: &reqwest::Client, base: &str, rid: &str, cost: f64) -> serde_json::Value {
    let body = serde_json::json!({"reservation": rid, "cost": cost});
    let (s, v) = ns_call(c, base, "ns", "commit", body).await;
    assert_eq!(s, 200, "{v}");
    v
}

async fn hit(c: &reqwest::Client, base: &str, key: &str, cost: f64) {
    let (s, v) = try_hit(c, base, key, cost, false).await;
    assert_eq!(s, 200, "{v}");
}

/// Refunds `cost` on key `k` of `ns`: the answer.
async fn refund(c: &reqwest::Client, base: &str, cost: f64) -> serde_json::Value {
    let r = c
        .post(format!("{base}/v1/namespaces/ns/keys/k/refund"))
        .json(&serde_json::json!({ "cost": cost }))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status().as_u16(), 200);
    r.json().await.expect("json")
}

/// `n` hits of 1 on key `k`, each after a dry run when `dry_runs` (a dry run that says
/// 429 must be followed by a 429): how many were admitted.
async fn admitted_of(c: &reqwest::Client, base: &str, n: usize, dry_runs: bool) -> f64 {
    let mut admitted = 0.0;
    for _ in 0..n {
        let dry = match dry_runs {
            true => Some(try_hit(c, base, "k", 1.0, true).await),
            false => None,
        };
        let (s, h) = try_hit(c, base, "k", 1.0, false).await;
        assert!(s == 200 || s == 429, "{s}: {h}");
        if let Some((dry, d)) = dry {
            assert!(dry == 200 || s == 429, "a dry run said {d}, the hit {h}");
        }
        admitted += f64::from(u8::from(s == 200));
    }
    admitted
}

/// Strict admission: 7 hit and 100 reserved late in a window; in the next, a hit rolls
/// the key's quota to the new window (the ended one's goes back to the store), then the
/// reservation is committed at 40. The 60 not used go back in the ended window, after
/// its quota did: the store ends at 47 there (48 with the new window's hit), and the
/// answer says 60.
async fn a_strict_commit_gives_back_in_a_window_whose_quota_went_back(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section(), STRICT));
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(2500).await;
    hit(&c, base, "k", 7.0).await;
    let rid = reserve(&c, base, 100.0).await;
    into_the_next_window(200).await;
    hit(&c, base, "k", 1.0).await;
    // the ended window's quota goes back at the engine's next ticks
    tokio::time::sleep(Duration::from_millis(800)).await;
    let v = commit(&c, base, &rid, 40.0).await;
    assert_eq!(v["keys"][0]["given_back"], 60.0, "{v}");
    // the new window's unused quota goes back once the key is idle (5 s)
    tokio::time::sleep(Duration::from_millis(6000)).await;
    let totals = store.totals("ns").await;
    assert_eq!(totals.get("k").copied(), Some(48.0), "{totals:?}");
}

/// Strict admission: 7 hit and 100 reserved late in a window, committed at 40 early in
/// the next, and the node SIGKILLed as soon as it answers. The 60 given back are in the
/// store when the commit answers, not at the node's next return of quota: the ended
/// window holds 47.
async fn a_strict_give_back_in_an_ended_window_is_in_the_store_when_it_answers(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section(), STRICT));
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(2500).await;
    hit(&c, base, "k", 7.0).await;
    let rid = reserve(&c, base, 100.0).await;
    into_the_next_window(300).await;
    let v = commit(&c, base, &rid, 40.0).await;
    node.signal("KILL");
    assert_eq!(v["keys"][0]["given_back"], 60.0, "{v}");
    let totals = store.totals("ns").await;
    assert_eq!(totals.get("k").copied(), Some(47.0), "{totals:?}");
}

/// Strict admission: 1 hit late in a window holds a block of 100 more. Once the window
/// has ended, the engine's next return gives its unused quota back, though no hit has
/// come since and the key is not yet idle: a node SIGKILLed 1 s into the next window
/// leaves the store holding 1, not 101.
async fn an_ended_window_gives_its_unused_quota_back_without_a_hit(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section(), STRICT));
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(2500).await;
    let (s, v) = try_hit(&c, base, "k", 1.0, false).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["remaining"].as_f64() > Some(90_000.0), "{v}");
    into_the_next_window(1000).await;
    node.signal("KILL");
    let totals = store.totals("ns").await;
    assert_eq!(totals.get("k").copied(), Some(1.0), "{totals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_window_gives_its_unused_quota_back_without_a_hit_on_redis() {
    an_ended_window_gives_its_unused_quota_back_without_a_hit(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_window_gives_its_unused_quota_back_without_a_hit_on_sqlite() {
    an_ended_window_gives_its_unused_quota_back_without_a_hit(TestStore::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_give_back_in_an_ended_window_is_in_the_store_when_it_answers_on_redis() {
    let store = TestStore::redis();
    a_strict_give_back_in_an_ended_window_is_in_the_store_when_it_answers(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_give_back_in_an_ended_window_is_in_the_store_when_it_answers_on_postgres() {
    let store = TestStore::postgres().await;
    a_strict_give_back_in_an_ended_window_is_in_the_store_when_it_answers(store).await;
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
    let (_dirs, a, b) = two_nodes(&config(&store.section(), "sync_rate = 30"));
    let c = reqwest::Client::new();
    // well inside one window
    into_the_next_window(300).await;
    let rid = reserve(&c, &a.base, 100.0).await;
    let v = commit(&c, &b.base, &rid, 70.0).await;
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

/// Strict admission, a limit of 100: 50 reserved, committed at 300. The commit charges
/// all of it (the default `overrun = "debt"`) and says the key is 200 past its limit,
/// with nothing remaining; a dry run and a hit on the node are then denied, saying the
/// same debt; the store holds 300.
async fn a_strict_commit_past_the_limit_answers_its_debt(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(
        dir.path(),
        &four_seconds(&store.section(), "ns", 100, STRICT),
    );
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(200).await;
    let rid = reserve(&c, base, 50.0).await;
    let v = commit(&c, base, &rid, 300.0).await;
    let k = &v["keys"][0];
    assert_eq!(
        (k["charged"].as_f64(), k["uncharged"].as_f64()),
        (Some(250.0), Some(0.0)),
        "{v}"
    );
    assert_eq!(k["debt"].as_f64(), Some(200.0), "{v}");
    assert_eq!(k["remaining"].as_f64(), Some(0.0), "{v}");
    for dry_run in [true, false] {
        let (s, v) = try_hit(&c, base, "k", 1.0, dry_run).await;
        assert_eq!(s, 429, "dry run {dry_run}: {v}");
        assert_eq!(v["remaining"].as_f64(), Some(0.0), "{v}");
    }
    // the node's unused quota (none) and its debt are in the store at once
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let totals = store.totals("ns").await;
    assert_eq!(totals.get("k").copied(), Some(300.0), "{totals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_commit_past_the_limit_answers_its_debt_on_redis() {
    a_strict_commit_past_the_limit_answers_its_debt(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_commit_past_the_limit_answers_its_debt_on_postgres() {
    a_strict_commit_past_the_limit_answers_its_debt(TestStore::postgres().await).await;
}

/// Strict admission, a sliding limit of 100: 60 reserved late in a window, committed at
/// 30 early in the next. The 30 used weigh on the new window (at least 75 % of them in
/// its first second): the commit's answer and a dry run after it leave at most 77, not
/// the 100 of a key with no previous window.
async fn a_strict_commit_after_a_window_ends_answers_with_the_ended_window(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(
        dir.path(),
        &four_seconds(&store.section(), "ns", 100, STRICT),
    );
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(2800).await;
    let rid = reserve(&c, base, 60.0).await;
    into_the_next_window(100).await;
    let v = commit(&c, base, &rid, 30.0).await;
    assert_eq!(v["keys"][0]["given_back"].as_f64(), Some(30.0), "{v}");
    let remaining = v["keys"][0]["remaining"].as_f64().expect("remaining");
    assert!((70.0..=77.0).contains(&remaining), "{v}");
    let (s, v) = try_hit(&c, base, "k", 1.0, true).await;
    assert_eq!(s, 200, "{v}");
    let remaining = v["remaining"].as_f64().expect("remaining");
    assert!((69.0..=77.0).contains(&remaining), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_commit_after_a_window_ends_answers_with_the_ended_window_on_redis() {
    a_strict_commit_after_a_window_ends_answers_with_the_ended_window(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_commit_after_a_window_ends_answers_with_the_ended_window_on_sqlite() {
    let store = TestStore::sqlite().await;
    a_strict_commit_after_a_window_ends_answers_with_the_ended_window(store).await;
}

/// Strict admission, a limit of 100: 10 hit, 30 reserved, committed at 110. The overrun
/// (80) fits no hold, so it counts past the quota — from what this node holds unused
/// first: the answer says the key is 20 past its limit, nothing remains, the node admits
/// nothing more from the quota it held, and the store ends at exactly 120.
async fn a_strict_overrun_counts_past_the_quota_held(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(
        dir.path(),
        &four_seconds(&store.section(), "ns", 100, STRICT),
    );
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(200).await;
    hit(&c, base, "k", 10.0).await;
    let rid = reserve(&c, base, 30.0).await;
    let v = commit(&c, base, &rid, 110.0).await;
    let k = &v["keys"][0];
    assert_eq!(k["charged"].as_f64(), Some(80.0), "{v}");
    assert_eq!(k["debt"].as_f64(), Some(20.0), "{v}");
    assert_eq!(k["remaining"].as_f64(), Some(0.0), "{v}");
    for _ in 0..20 {
        let (s, v) = try_hit(&c, base, "k", 1.0, false).await;
        assert_eq!(s, 429, "{v}");
    }
    // the key idle, what the node held unused (nothing) goes back
    tokio::time::sleep(Duration::from_millis(6000)).await;
    let totals = store.totals("ns").await;
    assert_eq!(totals.get("k").copied(), Some(120.0), "{totals:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_overrun_counts_past_the_quota_held_on_redis() {
    a_strict_overrun_counts_past_the_quota_held(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_overrun_counts_past_the_quota_held_on_postgres() {
    a_strict_overrun_counts_past_the_quota_held(TestStore::postgres().await).await;
}

/// A synchronous namespace, a limit of 100: node B hits 20, node A reserves 30 and
/// commits 120 (a debt of 40). A dry run on B then answers what a hit on B is answered:
/// denied, reading the key's count in the store, not B's own view of it.
async fn a_synchronous_dry_run_answers_what_a_hit_would(store: TestStore) {
    let (_dirs, a, b) = two_nodes(&four_seconds(&store.section(), "ns", 100, "sync_rate = 0"));
    let c = reqwest::Client::new();
    into_the_next_window(200).await;
    hit(&c, &b.base, "k", 20.0).await;
    let rid = reserve(&c, &a.base, 30.0).await;
    let v = commit(&c, &a.base, &rid, 120.0).await;
    assert_eq!(v["keys"][0]["debt"].as_f64(), Some(40.0), "{v}");
    for dry_run in [true, false] {
        let (s, v) = try_hit(&c, &b.base, "k", 1.0, dry_run).await;
        assert_eq!(s, 429, "dry run {dry_run}: {v}");
        assert_eq!(v["remaining"].as_f64(), Some(0.0), "{v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_dry_run_answers_what_a_hit_would_on_redis() {
    a_synchronous_dry_run_answers_what_a_hit_would(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_dry_run_answers_what_a_hit_would_on_sqlite() {
    a_synchronous_dry_run_answers_what_a_hit_would(TestStore::sqlite().await).await;
}

/// One strict namespace `ns` of a GCRA bucket of `burst`, refilling `burst` an hour,
/// with the settings `more`.
fn bucket(section: &str, burst: u32, more: &str) -> String {
    format!(
        "store_timeout = 5\nanswer_timeout = 5\n{section}
[[namespaces]]
name = \"ns\"
store = \"main\"
algorithm = \"gcra\"
gcra = {{ burst = {burst}, count = {burst}, period = \"1h\" }}
{STRICT}
{more}
"
    )
}

/// Strict admission of a GCRA bucket of 100 (refilling 100 an hour): 50 reserved, then
/// committed at 150. The overrun (100) is more than the store grants: it is spent from
/// the units this node was granted and has not spent first, the rest forced in. The
/// answer says the bucket is past its burst, and when a hit can pass again (no earlier
/// than the hit after it is told), and a dry run and 100 hits on the node are then all
/// denied: none is spent from units granted before the debt; a second
/// node's hits are denied too.
async fn a_strict_bucket_in_debt_admits_nothing(store: TestStore) {
    let (_dirs, a, b) = two_nodes(&bucket(&store.section(), 100, ""));
    let c = reqwest::Client::new();
    let rid = reserve(&c, &a.base, 50.0).await;
    let v = commit(&c, &a.base, &rid, 150.0).await;
    let k = &v["keys"][0];
    assert_eq!(k["charged"].as_f64(), Some(100.0), "{v}");
    let debt = k["debt"].as_f64().expect("debt");
    assert!((49.0..=56.0).contains(&debt), "{v}");
    assert_eq!(k["remaining"].as_f64(), Some(0.0), "{v}");
    // when the next hit can pass (a unit past the debt: 36 s), not when the debt is paid
    let retry = k["retry_after"].as_f64().expect("retry_after");
    let (s, v) = try_hit(&c, &a.base, "k", 1.0, true).await;
    assert_eq!(s, 429, "dry run: {v}");
    let hit_retry = v["retry_after"].as_f64().expect("retry_after");
    assert!(
        retry + 1.0 >= hit_retry,
        "the commit said {retry}, a hit {hit_retry}"
    );
    for node in [&a, &b] {
        let admitted = admitted_of(&c, &node.base, 100, false).await;
        assert_eq!(admitted, 0.0, "hits admitted in debt on {}", node.base);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_bucket_in_debt_admits_nothing_on_redis() {
    a_strict_bucket_in_debt_admits_nothing(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strict_bucket_in_debt_admits_nothing_on_postgres() {
    a_strict_bucket_in_debt_admits_nothing(TestStore::postgres().await).await;
}

/// Strict admission, a limit of 100: 30 reserved, committed at 110 (10 past the limit),
/// then 20 refunded: the window counts 90, so the refund's answer says 10 remain, though
/// the node now holds 20 unused, and exactly 10 more hits of 1 are admitted.
async fn a_refund_in_debt_answers_what_the_window_leaves(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(
        dir.path(),
        &four_seconds(&store.section(), "ns", 100, STRICT),
    );
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(200).await;
    let rid = reserve(&c, base, 30.0).await;
    let v = commit(&c, base, &rid, 110.0).await;
    assert_eq!(v["keys"][0]["debt"].as_f64(), Some(10.0), "{v}");
    let v = refund(&c, base, 20.0).await;
    assert_eq!(v["refunded"].as_f64(), Some(20.0), "{v}");
    assert_eq!(v["remaining"].as_f64(), Some(10.0), "{v}");
    assert_eq!(admitted_of(&c, base, 20, true).await, 10.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_debt_answers_what_the_window_leaves_on_redis() {
    a_refund_in_debt_answers_what_the_window_leaves(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_debt_answers_what_the_window_leaves_on_postgres() {
    a_refund_in_debt_answers_what_the_window_leaves(TestStore::postgres().await).await;
}

/// Strict admission of a GCRA bucket of 100: 20 and 50 reserved, the 50 committed at
/// 150 (a debt of about 70), a hit denied (the node asks the store again), then 60
/// refunded and the 20 committed at 0. The units the node was granted went into the
/// debt: the refund's and the commit's answers say nothing remains, what they give back
/// does not take the bucket under its burst, and of 60 hits after them the node admits
/// none, each denied when a dry run just before it says so.
async fn a_refund_in_a_bucket_in_debt_admits_no_more_than_it_gives_back(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &bucket(&store.section(), 100, ""));
    let (c, base) = (reqwest::Client::new(), &node.base);
    let small = reserve(&c, base, 20.0).await;
    let rid = reserve(&c, base, 50.0).await;
    let v = commit(&c, base, &rid, 150.0).await;
    let debt = v["keys"][0]["debt"].as_f64().expect("debt");
    assert!(debt >= 69.0, "{v}");
    let (s, v) = try_hit(&c, base, "k", 1.0, false).await;
    assert_eq!(s, 429, "{v}");
    let v = refund(&c, base, 60.0).await;
    assert_eq!(v["remaining"].as_f64(), Some(0.0), "{v}");
    let refunded = v["refunded"].as_f64().expect("refunded");
    let v = commit(&c, base, &small, 0.0).await;
    assert_eq!(v["keys"][0]["remaining"].as_f64(), Some(0.0), "{v}");
    let given_back = v["keys"][0]["given_back"].as_f64().expect("given_back");
    let admitted = admitted_of(&c, base, 60, true).await;
    assert!(
        admitted <= (refunded + given_back - debt).max(0.0),
        "{admitted} admitted after {refunded} refunded and {given_back} given back in a debt of {debt}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_a_bucket_in_debt_admits_no_more_than_it_gives_back_on_redis() {
    a_refund_in_a_bucket_in_debt_admits_no_more_than_it_gives_back(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_in_a_bucket_in_debt_admits_no_more_than_it_gives_back_on_sqlite() {
    let store = TestStore::sqlite().await;
    a_refund_in_a_bucket_in_debt_admits_no_more_than_it_gives_back(store).await;
}

/// Strict admission, a limit of 100: node A reserves 50 and commits 110 (10 past the
/// limit). Node B, which holds nothing of the key, refunds 1: it gives nothing back, and
/// answers the key as it is (nothing remains), and B's dry run after it says 429 as a
/// hit there does.
async fn a_refund_on_a_node_holding_nothing_answers_the_key_as_it_is(store: TestStore) {
    let (_dirs, a, b) = two_nodes(&four_seconds(&store.section(), "ns", 100, STRICT));
    let c = reqwest::Client::new();
    into_the_next_window(200).await;
    let rid = reserve(&c, &a.base, 50.0).await;
    let v = commit(&c, &a.base, &rid, 110.0).await;
    assert_eq!(v["keys"][0]["debt"].as_f64(), Some(10.0), "{v}");
    // B's view of the key: the store's count, read at its next sync
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let v = refund(&c, &b.base, 1.0).await;
    assert_eq!(v["refunded"].as_f64(), Some(0.0), "{v}");
    assert_eq!(v["remaining"].as_f64(), Some(0.0), "{v}");
    for dry_run in [true, false] {
        let (s, v) = try_hit(&c, &b.base, "k", 1.0, dry_run).await;
        assert_eq!(s, 429, "dry run {dry_run}: {v}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_a_node_holding_nothing_answers_the_key_as_it_is_on_redis() {
    a_refund_on_a_node_holding_nothing_answers_the_key_as_it_is(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_on_a_node_holding_nothing_answers_the_key_as_it_is_on_postgres() {
    let store = TestStore::postgres().await;
    a_refund_on_a_node_holding_nothing_answers_the_key_as_it_is(store).await;
}

/// `overrun = "cap"`, a limit of 100 a fixed 4 s window: 50 reserved, committed at 150.
/// 50 are charged, 50 uncharged, and the key is at its limit: the answer says when the
/// next hit can pass (the window's end), not 0, and no earlier than a hit after it is
/// told.
async fn a_capped_commit_at_the_limit_says_when_the_next_hit_passes(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let mode = "sync_rate = 0\noverrun = \"cap\"\nalgorithm = \"fixed_window\"";
    let node = node_in(dir.path(), &four_seconds(&store.section(), "ns", 100, mode));
    let (c, base) = (reqwest::Client::new(), &node.base);
    into_the_next_window(200).await;
    let rid = reserve(&c, base, 50.0).await;
    let v = commit(&c, base, &rid, 150.0).await;
    let k = &v["keys"][0];
    assert_eq!(
        (k["charged"].as_f64(), k["uncharged"].as_f64()),
        (Some(50.0), Some(50.0)),
        "{v}"
    );
    assert_eq!(k["remaining"].as_f64(), Some(0.0), "{v}");
    let retry = k["retry_after"].as_f64().expect("retry_after");
    let (s, h) = try_hit(&c, base, "k", 1.0, false).await;
    assert_eq!(s, 429, "{h}");
    let hit_retry = h["retry_after"].as_f64().expect("retry_after");
    assert!(
        retry > 0.0 && retry + 0.5 >= hit_retry,
        "the commit said {retry}, a hit {hit_retry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_commit_at_the_limit_says_when_the_next_hit_passes_on_redis() {
    a_capped_commit_at_the_limit_says_when_the_next_hit_passes(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_commit_at_the_limit_says_when_the_next_hit_passes_on_sqlite() {
    let store = TestStore::sqlite().await;
    a_capped_commit_at_the_limit_says_when_the_next_hit_passes(store).await;
}

/// Strict admission of a GCRA bucket of 20, `overrun = "cap"`: 1 reserved (the node
/// holds a unit more), committed at 19. The bucket leaves 18 units: this node's unused
/// one and 17 in the store, which one take cannot have at once. The commit charges the
/// store's 17 at least (it used to charge nothing: `uncharged` 18), and the node admits
/// no more than the bucket then leaves.
async fn a_capped_bucket_commit_charges_what_the_bucket_leaves(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(
        dir.path(),
        &bucket(&store.section(), 20, "overrun = \"cap\""),
    );
    let (c, base) = (reqwest::Client::new(), &node.base);
    let rid = reserve(&c, base, 1.0).await;
    let v = commit(&c, base, &rid, 19.0).await;
    let charged = v["keys"][0]["charged"].as_f64().expect("charged");
    assert!(charged >= 17.0, "{v}");
    let admitted = admitted_of(&c, base, 25, true).await;
    assert!(
        1.0 + charged + admitted <= 20.0,
        "{v}: then {admitted} admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_bucket_commit_charges_what_the_bucket_leaves_on_redis() {
    a_capped_bucket_commit_charges_what_the_bucket_leaves(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_bucket_commit_charges_what_the_bucket_leaves_on_postgres() {
    let store = TestStore::postgres().await;
    a_capped_bucket_commit_charges_what_the_bucket_leaves(store).await;
}

/// Strict admission, a sliding limit of 100: late in a window node B reserves 20 and
/// node A reserves 50, then commits it at 110 (a debt). Just after the window ends, B
/// commits at 4: its 16 go back into the ended window, and B's answer counts that window
/// as the store then has it (about 114, every node's hits in it), not as B last saw it:
/// nothing remains, and a dry run on B says 429 as a hit there does. Windows of 20 s:
/// the ended window weighs enough for nothing to remain until 2.4 s into the next (with
/// windows of 4 s, 0.5 s: a loaded machine answered the last hit past it).
async fn a_give_back_into_an_ended_window_answers_it_as_the_store_has_it(store: TestStore) {
    let (_dirs, a, b) = two_nodes(&twenty_seconds(&store.section()));
    let c = reqwest::Client::new();
    into_the_next_window_of(20, 17500).await;
    let small = reserve(&c, &b.base, 20.0).await;
    let rid = reserve(&c, &a.base, 50.0).await;
    let v = commit(&c, &a.base, &rid, 110.0).await;
    assert!(v["keys"][0]["debt"].as_f64() > Some(0.0), "{v}");
    into_the_next_window_of(20, 50).await;
    b_s_commit_answers_the_ended_window_as_the_store_has_it(&c, &b.base, &small).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_into_an_ended_window_answers_it_as_the_store_has_it_on_redis() {
    a_give_back_into_an_ended_window_answers_it_as_the_store_has_it(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_into_an_ended_window_answers_it_as_the_store_has_it_on_postgres() {
    let store = TestStore::postgres().await;
    a_give_back_into_an_ended_window_answers_it_as_the_store_has_it(store).await;
}

/// B commits its reservation of 20 at 4 just after the window ended: 16 given back,
/// and the window answered as the store has it (A's debt in it): nothing remains, and a
/// dry run says 429 as a hit does.
async fn b_s_commit_answers_the_ended_window_as_the_store_has_it(
    c: &reqwest::Client,
    base: &str,
    small: &str,
) {
    let v = commit(c, base, small, 4.0).await;
    assert_eq!(v["keys"][0]["given_back"].as_f64(), Some(16.0), "{v}");
    assert_eq!(v["keys"][0]["remaining"].as_f64(), Some(0.0), "{v}");
    for dry_run in [true, false] {
        let (s, v) = try_hit(c, base, "k", 1.0, dry_run).await;
        assert_eq!(s, 429, "dry run {dry_run}: {v}");
    }
}

/// As above, with the reply to B's first return of quota after the window ended held
/// back 1 s: B's engine sends the ended window's unused quota back at its first tick
/// after the end, and that return is still out when B's commit gives back into the
/// window. The commit waits for it, then returns its own give-back, and answers the
/// window as the store then has it (it used to skip its return while another was out,
/// and answer the window as B last saw it, where a hit is refused). Windows of 20 s:
/// the answer comes within the first 1.5 s, where the ended window still weighs enough
/// (until 2.4 s) for nothing to remain. PostgreSQL: the return and the commit go out
/// on connections of their own (on Redis the node's one connection keeps them in order,
/// so the commit's calls come back after the return).
async fn a_give_back_while_the_tick_s_return_is_out_answers_the_store_s_window(store: TestStore) {
    let relay = swin_testkit::Relay::to_url(&store.url).await;
    // every statement sent with its text, so that the hold's can be told from others
    let via = store.section_via(&relay).replace(
        "sslmode=disable",
        "sslmode=disable&statement-cache-capacity=0",
    );
    let dirs = [0, 1].map(|_| tempfile::tempdir().expect("dir"));
    let a = node_in(dirs[0].path(), &twenty_seconds(&store.section()));
    let b = node_in(dirs[1].path(), &twenty_seconds(&via));
    let c = reqwest::Client::new();
    into_the_next_window_of(20, 17500).await;
    let small = reserve(&c, &b.base, 20.0).await;
    let rid = reserve(&c, &a.base, 50.0).await;
    let v = commit(&c, &a.base, &rid, 110.0).await;
    assert!(v["keys"][0]["debt"].as_f64() > Some(0.0), "{v}");
    // B's next hold: its engine's return of the ended window, at its first tick after it
    let hold: &[u8] = match store.url.starts_with("redis") {
        true => HOLD_SHA.as_bytes(),
        false => b"coalesce(h.held, 0)",
    };
    relay.delay_reply_to(&[hold], Duration::from_millis(1000));
    into_the_next_window_of(20, 300).await;
    b_s_commit_answers_the_ended_window_as_the_store_has_it(&c, &b.base, &small).await;
}

/// The SHA1 Redis knows strict admission's hold script by (its `EVALSHA`s carry it).
static HOLD_SHA: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    redis::Script::new(include_str!("../../../swin-sync/src/store/redis/hold.lua"))
        .get_hash()
        .to_owned()
});

/// Strict admission on `ns`, a sliding limit of 100 in windows of 20 s.
fn twenty_seconds(section: &str) -> String {
    four_seconds(section, "ns", 100, STRICT)
        .replace("window_sizes = [4]", "window_sizes = [20]")
        .replace("window_size = 4,", "window_size = 20,")
}

/// Sleeps until `ms` into the next window of `size` seconds.
async fn into_the_next_window_of(size: u64, ms: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    let period = size * 1000;
    let target = (now / period + 1) * period + ms;
    tokio::time::sleep(Duration::from_millis(target - now)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_while_the_tick_s_return_is_out_answers_the_store_s_window_on_postgres() {
    let store = TestStore::postgres().await;
    a_give_back_while_the_tick_s_return_is_out_answers_the_store_s_window(store).await;
}

/// Strict admission of a GCRA bucket of 100 on two nodes: A reserves 30 and hits 40.
/// B, which holds nothing of the key, commits the reservation at 10 (it gives nothing
/// back) and answers the bucket as the store has it (at most 30 left), not a full one;
/// then commits A's reserve of 5 at 65, a debt: the debt counts A's spends, and the
/// answer says when a hit on B passes no earlier than that hit is told.
async fn a_bucket_commit_on_a_node_holding_nothing_answers_the_store_s_bucket(store: TestStore) {
    let (_dirs, a, b) = two_nodes(&bucket(&store.section(), 100, ""));
    let c = reqwest::Client::new();
    let first = reserve(&c, &a.base, 30.0).await;
    hit(&c, &a.base, "k", 40.0).await;
    let v = commit(&c, &b.base, &first, 10.0).await;
    let remaining = v["keys"][0]["remaining"].as_f64().expect("remaining");
    assert!(remaining <= 30.0, "{v}");
    let second = reserve(&c, &a.base, 5.0).await;
    let v = commit(&c, &b.base, &second, 65.0).await;
    let debt = v["keys"][0]["debt"].as_f64().expect("debt");
    assert!(debt >= 34.0, "{v}");
    let retry = v["keys"][0]["retry_after"].as_f64().expect("retry_after");
    let (s, h) = try_hit(&c, &b.base, "k", 1.0, false).await;
    assert_eq!(s, 429, "{h}");
    let hit_retry = h["retry_after"].as_f64().expect("retry_after");
    assert!(
        retry + 1.0 >= hit_retry,
        "the commit said {retry}, a hit {hit_retry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_commit_on_a_node_holding_nothing_answers_the_store_s_bucket_on_redis() {
    let store = TestStore::redis();
    a_bucket_commit_on_a_node_holding_nothing_answers_the_store_s_bucket(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_commit_on_a_node_holding_nothing_answers_the_store_s_bucket_on_postgres() {
    let store = TestStore::postgres().await;
    a_bucket_commit_on_a_node_holding_nothing_answers_the_store_s_bucket(store).await;
}
