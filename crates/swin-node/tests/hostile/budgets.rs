//! Token budgets against the real binary and real stores: one commit raced on two
//! nodes settles once; an extend after the ttl counts nothing; a reservation over
//! several keys survives a store outage between its reserve and its commit; a key in
//! debt is denied with a Retry-After; a reserve denied by one key spends nothing on
//! any; a commit in the window after its reserve's gives back where the reserve
//! counted; and bad input is a 4xx naming the field. Each with exact counts.

use std::time::Duration;

use swin_testkit::cluster::{key_call, read, within, Node, TestStore};

use super::support::{node_in, post, OwnRedis};

/// `budget` (10 a day per key, debt), `capped` (the same, `overrun = "cap"`) and `big`
/// (1,000 a day), all synchronous.
fn config(section: &str) -> String {
    let ns = |name: &str, limit: u32, more: &str| {
        format!(
            "
[[namespaces]]
name = \"{name}\"
window_sizes = [86400]
sync_rate = 0
store = \"main\"
limits = [{{ window_size = 86400, limit = {limit} }}]
{more}"
        )
    };
    format!(
        "store_timeout = 1\n{section}{}{}{}",
        ns("budget", 10, ""),
        ns("capped", 10, "overrun = \"cap\"\n"),
        ns("big", 1000, ""),
    )
}

/// A namespace-wide call (`reserve`, `extend`, `commit`) on `ns`.
pub(crate) async fn ns_call(
    c: &reqwest::Client,
    base: &str,
    ns: &str,
    op: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    post(c, format!("{base}/v1/namespaces/{ns}/{op}"), body).await
}

async fn count(c: &reqwest::Client, base: &str, ns: &str, key: &str) -> f64 {
    let v = read(c, base, ns, key).await;
    v.current + v.previous
}

pub(crate) fn id(v: &serde_json::Value) -> String {
    v["reservation"].as_str().expect("reservation").to_owned()
}

/// Two nodes over `store`.
fn two_nodes(store: &TestStore) -> (tempfile::TempDir, tempfile::TempDir, Node, Node) {
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let a = node_in(da.path(), &config(&store.section()));
    let b = node_in(db.path(), &config(&store.section()));
    (da, db, a, b)
}

/// Twenty reservations over two keys, each committed on both nodes at once: exactly one
/// commit of each settles, the other is told how (200 `replayed`), and the store holds exactly the sum
/// of the actual costs on each key.
async fn a_commit_raced_on_two_nodes_settles_once(store: TestStore) {
    let (_da, _db, a, b) = two_nodes(&store);
    let c = reqwest::Client::new();
    let mut expected = 0.0;
    for i in 0..20u32 {
        let keys = serde_json::json!({"keys": ["tenant", "user"], "cost": 10});
        let (s, v) = ns_call(&c, &a.base, "big", "reserve", keys).await;
        assert_eq!(s, 200, "{v}");
        let rid = id(&v);
        let actual = f64::from(i % 7) * 3.0;
        expected += actual;
        let body = serde_json::json!({"reservation": rid, "cost": actual});
        let (x, y) = tokio::join!(
            ns_call(&c, &a.base, "big", "commit", body.clone()),
            ns_call(&c, &b.base, "big", "commit", body),
        );
        // both 200: the one that ended it settled it, the other is told how (replayed)
        assert_eq!([x.0, y.0], [200, 200], "{i}: {x:?} {y:?}");
        let replayed = |v: &serde_json::Value| v["keys"][0]["replayed"] == true;
        assert!(
            replayed(&x.1) != replayed(&y.1),
            "{i}: one settled: {x:?} {y:?}"
        );
    }
    // read from the store itself (a node's view of keys the other node changed lags)
    let totals = store.totals("big").await;
    for key in ["tenant", "user"] {
        assert_eq!(
            totals.get(key).copied(),
            Some(expected),
            "{key}: {totals:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_raced_on_two_nodes_settles_once_on_postgres() {
    a_commit_raced_on_two_nodes_settles_once(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_raced_on_two_nodes_settles_once_on_redis() {
    a_commit_raced_on_two_nodes_settles_once(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_raced_on_two_nodes_settles_once_on_sqlite() {
    a_commit_raced_on_two_nodes_settles_once(TestStore::sqlite().await).await;
}

/// An extend after the ttl is 404 on either node and counts nothing; so is a commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_after_the_ttl_counts_nothing() {
    let store = TestStore::postgres().await;
    let (_da, _db, a, b) = two_nodes(&store);
    let c = reqwest::Client::new();
    let body = serde_json::json!({"keys": ["tenant", "user"], "cost": 4, "ttl": 0.3});
    let (s, v) = ns_call(&c, &a.base, "big", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let rid = id(&v);
    tokio::time::sleep(Duration::from_millis(600)).await;
    let more = serde_json::json!({"reservation": rid, "cost": 5});
    for base in [&a.base, &b.base] {
        let (s, v) = ns_call(&c, base, "big", "extend", more.clone()).await;
        assert_eq!(
            (s, &v["error"]["code"]),
            (404, &"unknown_reservation".into()),
            "{v}"
        );
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("reservation"),
            "{v}"
        );
    }
    let (s, _) = ns_call(&c, &b.base, "big", "commit", more).await;
    assert_eq!(s, 404);
    for key in ["tenant", "user"] {
        assert_eq!(
            count(&c, &b.base, "big", key).await,
            4.0,
            "lapsed at its total"
        );
    }
}

/// The store goes away between a reserve over two keys and its commit: the commit and
/// an extend are 503 and change nothing, a reserve meanwhile spends nothing; once the
/// store is back the commit settles once, at the actual cost, on both keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_between_reserve_and_commit_loses_nothing() {
    let mut own = OwnRedis::start(|s: &TestStore| config(&s.section()));
    let c = reqwest::Client::new();
    let base = own.node.base.clone();
    let body = serde_json::json!({"keys": ["tenant", "user"], "cost": 100});
    let (s, v) = ns_call(&c, &base, "big", "reserve", body.clone()).await;
    assert_eq!(s, 200, "{v}");
    let rid = id(&v);

    drop(own.server.take()); // the store goes away
    let (s, v) = ns_call(&c, &base, "big", "reserve", body).await;
    assert_eq!(s, 503, "{v}");
    let more = serde_json::json!({"reservation": rid, "cost": 5});
    let (s, v) = ns_call(&c, &base, "big", "extend", more).await;
    assert_eq!(s, 503, "{v}");
    let commit = serde_json::json!({"reservation": rid, "cost": 30});
    let (s, v) = ns_call(&c, &base, "big", "commit", commit.clone()).await;
    assert_eq!(
        (s, &v["error"]["code"]),
        (503, &"store_unreachable".into()),
        "{v}"
    );

    own.restart();
    within(
        Duration::from_secs(15),
        "the commit goes through",
        async || {
            let (s, v) = ns_call(&c, &base, "big", "commit", commit.clone()).await;
            assert!(s == 200 || s == 503, "{s} {v}");
            if s == 200 {
                for k in v["keys"].as_array().expect("keys") {
                    assert_eq!(k["given_back"], 70.0, "{v}");
                }
            }
            s == 200
        },
    )
    .await;
    let (s, v) = ns_call(&c, &base, "big", "commit", commit).await;
    assert_eq!(
        (s, &v["keys"][0]["replayed"]),
        (200, &true.into()),
        "settled once: {v}"
    );
    for key in ["tenant", "user"] {
        within(
            Duration::from_secs(5),
            "the count is the actual cost",
            async || count(&c, &base, "big", key).await == 30.0,
        )
        .await;
    }
}

/// A commit past the limit under debt: the whole overrun counts, the key is denied with
/// a Retry-After (header and body agree) and nothing more counts; under `cap` the same
/// commit stops at the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_debt_is_denied_with_retry_after() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section()));
    let c = reqwest::Client::new();
    let base = &node.base;
    for (ns, charged, held) in [("budget", 14.0, 18.0), ("capped", 6.0, 10.0)] {
        let (s, v) = key_call(&c, base, ns, "k", "reserve", serde_json::json!({"cost": 4})).await;
        assert_eq!(s, 200, "{v}");
        let commit = serde_json::json!({"reservation": id(&v), "cost": 18});
        let (s, v) = key_call(&c, base, ns, "k", "commit", commit).await;
        assert_eq!((s, &v["charged"]), (200, &charged.into()), "{ns}: {v}");
        assert_eq!(count(&c, base, ns, "k").await, held, "{ns}");
        let r = c
            .post(format!("{base}/v1/namespaces/{ns}/keys/k/hit"))
            .json(&serde_json::json!({"cost": 1}))
            .send()
            .await
            .expect("send");
        assert_eq!(r.status(), 429, "{ns}");
        let header: u64 = r
            .headers()
            .get("retry-after")
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.parse().ok())
            .expect("Retry-After");
        let v: serde_json::Value = r.json().await.expect("json");
        let body = v["retry_after"].as_f64().expect("retry_after");
        assert!(header >= 1 && header as f64 >= body, "{ns}: {header} {v}");
        // the rest of this window, then as much of the next as its weight needs to fall
        // (sliding): at most two windows, whatever the time of day
        assert!(header <= 2 * 86_400, "{ns}: {header} within two windows");
        let (s, _) = key_call(&c, base, ns, "k", "reserve", serde_json::json!({"cost": 1})).await;
        assert_eq!(s, 429, "{ns}");
        assert_eq!(
            count(&c, base, ns, "k").await,
            held,
            "{ns}: denied, not counted"
        );
    }
    let (_, v) = key_call(
        &c,
        base,
        "budget",
        "k",
        "hit",
        serde_json::json!({"cost": 0}),
    )
    .await;
    assert_eq!(v["remaining"], 0.0, "{v}");
}

/// `user` has 9 of 10: a reserve of 2 over `tenant` and `user` is denied and spends
/// nothing on either key; extends are all or nothing the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_denied_by_one_key_spends_nothing_on_any() {
    let store = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section()));
    let c = reqwest::Client::new();
    let base = &node.base;
    let (s, _) = key_call(
        &c,
        base,
        "budget",
        "user",
        "hit",
        serde_json::json!({"cost": 9}),
    )
    .await;
    assert_eq!(s, 200);
    let body = serde_json::json!({"keys": ["tenant", "user"], "cost": 2});
    let (s, v) = ns_call(&c, base, "budget", "reserve", body).await;
    assert_eq!(s, 429, "{v}");
    assert!(v.get("reservation").is_none(), "{v}");
    let allowed: Vec<Option<bool>> = v["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| k["allowed"].as_bool())
        .collect();
    assert_eq!(allowed, [Some(true), Some(false)], "{v}");
    assert_eq!(count(&c, base, "budget", "tenant").await, 0.0);
    assert_eq!(count(&c, base, "budget", "user").await, 9.0);
    // an extend refused by one key: nothing on either, the reservation unchanged
    let body = serde_json::json!({"keys": ["tenant", "other"], "cost": 5});
    let (s, v) = ns_call(&c, base, "budget", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let rid = id(&v);
    let (_, _) = key_call(
        &c,
        base,
        "budget",
        "other",
        "hit",
        serde_json::json!({"cost": 4}),
    )
    .await;
    let more = serde_json::json!({"reservation": rid, "cost": 3});
    let (s, v) = ns_call(&c, base, "budget", "extend", more).await;
    assert_eq!((s, &v["total"]), (429, &5.0.into()), "{v}");
    assert_eq!(count(&c, base, "budget", "tenant").await, 5.0);
    assert_eq!(count(&c, base, "budget", "other").await, 9.0);
}

/// One namespace `name` of `limit` per 4 s window, as `mode` says (synchronous when it
/// says nothing); a store slowed by the tests beside it has 5 s to answer, and requests
/// wait for it (a strict hit answered locally past `answer_timeout` is counted as
/// eventual admission counts, where no commit's give-back finds it).
pub(crate) fn four_seconds(section: &str, name: &str, limit: u32, mode: &str) -> String {
    format!(
        "store_timeout = 5\nanswer_timeout = 5\n{section}
[[namespaces]]
name = \"{name}\"
window_sizes = [4]
store = \"main\"
limits = [{{ window_size = 4, limit = {limit} }}]
{mode}
"
    )
}

const SYNCHRONOUS: &str = "sync_rate = 0";
const LOCAL_ONLY: &str = "sync_rate = -1";

/// Sleeps until `at_ms` into the next 4 s window.
pub(crate) async fn into_the_next_window(at_ms: u64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64;
    tokio::time::sleep(Duration::from_millis(4000 - now % 4000 + at_ms)).await;
}

/// A stream that crosses a window's end: a reservation of 900 over two keys made in one
/// window and committed at 100 in the next gives back 800 on each from the window the
/// reserve counted in, not from the new window's other hits (100 on one key), and one of
/// 600 extended by 300 after the window's end and committed at 100 gives back 800 too
/// (the extend's 300 from the new window, 500 from the old): in the store and on the
/// node, each key holds exactly what was used, in the window it was used in.
async fn a_commit_in_the_next_window_gives_back_where_the_reserve_counted(
    store: TestStore,
    mode: &str,
) {
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(
        dir.path(),
        &four_seconds(&store.section(), "tick", 1000, mode),
    );
    let c = reqwest::Client::new();
    let base = &node.base;
    into_the_next_window(300).await;
    let body = serde_json::json!({"keys": ["tenant", "user"], "cost": 900});
    let (s, v) = ns_call(&c, base, "tick", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let two = id(&v);
    let body = serde_json::json!({"keys": ["stream"], "cost": 600});
    let (s, v) = ns_call(&c, base, "tick", "reserve", body).await;
    assert_eq!(s, 200, "{v}");
    let one = id(&v);
    // the next window, well before its end
    into_the_next_window(500).await;
    let r = c
        .post(format!("{base}/v1/namespaces/tick/keys/tenant/hit"))
        .json(&serde_json::json!({"cost": 100}))
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let more = serde_json::json!({"reservation": one, "cost": 300});
    let (s, v) = ns_call(&c, base, "tick", "extend", more).await;
    assert_eq!((s, &v["total"]), (200, &900.0.into()), "{v}");
    for rid in [two, one] {
        let commit = serde_json::json!({"reservation": rid, "cost": 100});
        let (s, v) = ns_call(&c, base, "tick", "commit", commit).await;
        assert_eq!(s, 200, "{v}");
        for k in v["keys"].as_array().expect("keys") {
            assert_eq!(k["given_back"], 800.0, "{v}");
        }
    }
    let in_store = mode == SYNCHRONOUS;
    let totals = store.totals("tick").await;
    // (key, the ended window, the new one)
    for (key, previous, current) in [("tenant", 100.0, 100.0), ("user", 100.0, 0.0)] {
        let total = previous + current;
        if in_store {
            assert_eq!(totals.get(key).copied(), Some(total), "{key}: {totals:?}");
        }
        let v = read(&c, base, "tick", key).await;
        assert_eq!((v.previous, v.current), (previous, current), "{key}");
    }
    if in_store {
        assert_eq!(totals.get("stream").copied(), Some(100.0), "{totals:?}");
    }
    assert_eq!(count(&c, base, "tick", "stream").await, 100.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_the_next_window_gives_back_where_the_reserve_counted_on_redis() {
    a_commit_in_the_next_window_gives_back_where_the_reserve_counted(
        TestStore::redis(),
        SYNCHRONOUS,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_the_next_window_gives_back_where_the_reserve_counted_local_only() {
    let store = TestStore::redis();
    a_commit_in_the_next_window_gives_back_where_the_reserve_counted(store, LOCAL_ONLY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_the_next_window_gives_back_where_the_reserve_counted_on_sqlite() {
    let store = TestStore::sqlite().await;
    a_commit_in_the_next_window_gives_back_where_the_reserve_counted(store, SYNCHRONOUS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_in_the_next_window_gives_back_where_the_reserve_counted_on_postgres() {
    let store = TestStore::postgres().await;
    a_commit_in_the_next_window_gives_back_where_the_reserve_counted(store, SYNCHRONOUS).await;
}

/// Bad input, each a 4xx naming its field, and nothing counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_reservations_are_refused_naming_the_field() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section()));
    let c = reqwest::Client::new();
    let base = &node.base;
    let (s, v) = ns_call(
        &c,
        base,
        "big",
        "reserve",
        serde_json::json!({"keys": ["a"], "cost": 1}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let of_big = id(&v);
    let seventeen: Vec<String> = (0..17).map(|i| format!("k{i}")).collect();
    let cases = [
        (
            "reserve",
            serde_json::json!({"keys": [], "cost": 1}),
            400,
            "keys",
        ),
        (
            "reserve",
            serde_json::json!({"keys": ["a", "b", "a"], "cost": 1}),
            400,
            "keys[2]",
        ),
        (
            "reserve",
            serde_json::json!({"keys": seventeen, "cost": 1}),
            400,
            "keys",
        ),
        (
            "reserve",
            serde_json::json!({"keys": ["a", ""], "cost": 1}),
            400,
            "keys[1]",
        ),
        (
            "reserve",
            serde_json::json!({"keys": "a", "cost": 1}),
            400,
            "keys",
        ),
        ("reserve", serde_json::json!({"cost": 1}), 400, "keys"),
        (
            "reserve",
            serde_json::json!({"keys": ["a"], "cost": "12"}),
            400,
            "cost",
        ),
        (
            "reserve",
            serde_json::json!({"keys": ["a"], "cost": -1}),
            400,
            "cost",
        ),
        (
            "reserve",
            serde_json::json!({"keys": ["a"], "cost": 11}),
            400,
            "cost",
        ),
        (
            "reserve",
            serde_json::json!({"keys": ["a"], "cost": 1, "ttl": 0}),
            400,
            "ttl",
        ),
        (
            "extend",
            serde_json::json!({"reservation": of_big, "cost": "x"}),
            400,
            "cost",
        ),
        (
            "extend",
            serde_json::json!({"reservation": "nope", "cost": 1}),
            400,
            "reservation",
        ),
        (
            "commit",
            serde_json::json!({"reservation": of_big}),
            400,
            "cost",
        ),
        ("commit", serde_json::json!({"cost": 1}), 400, "reservation"),
        // an id from another namespace is not open in this one
        (
            "extend",
            serde_json::json!({"reservation": of_big, "cost": 1}),
            404,
            "reservation",
        ),
        (
            "commit",
            serde_json::json!({"reservation": of_big, "cost": 1}),
            404,
            "reservation",
        ),
    ];
    for (op, body, status, field) in cases {
        let (s, v) = ns_call(&c, base, "budget", op, body.clone()).await;
        assert_eq!(s, status, "{op} {body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(field), "{op} {body}: {v}");
    }
    for key in ["a", "b", "k0"] {
        assert_eq!(count(&c, base, "budget", key).await, 0.0, "{key}");
    }
    // and the reservation of `big` is still good there
    let commit = serde_json::json!({"reservation": of_big, "cost": 1});
    let (s, v) = ns_call(&c, base, "big", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(count(&c, base, "big", "a").await, 1.0);
}

/// A commit whose settlement the count cannot take (past 2^53) comes after its
/// reservation ended: its 400 says the reservation ended at its estimate (not that
/// nothing changed), a second commit of it is 404, and the count holds exactly the
/// first commit's cost and the second's estimate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_refused_past_2_53_says_the_reservation_ended_at_its_estimate() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let node = node_in(dir.path(), &config(&store.section()));
    let c = reqwest::Client::new();
    let base = &node.base;
    let reserve = serde_json::json!({"cost": 100});
    let (s, r1) = key_call(&c, base, "big", "k", "reserve", reserve.clone()).await;
    assert_eq!(s, 200, "{r1}");
    let (s, r2) = key_call(&c, base, "big", "k", "reserve", reserve).await;
    assert_eq!(s, 200, "{r2}");
    let huge = 9_007_199_254_739_992_u64;
    let commit = serde_json::json!({"reservation": id(&r1), "cost": huge});
    let (s, v) = key_call(&c, base, "big", "k", "commit", commit).await;
    assert_eq!(s, 200, "{v}");
    let commit = serde_json::json!({"reservation": id(&r2), "cost": 5000});
    let (s, v) = key_call(&c, base, "big", "k", "commit", commit.clone()).await;
    assert_eq!(s, 400, "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("ended at its estimate"), "{v}");
    // the same commit again is told the reservation was committed (the figures as
    // asked), and changes nothing
    let (s, v) = key_call(&c, base, "big", "k", "commit", commit).await;
    assert_eq!((s, &v["replayed"]), (200, &true.into()), "{v}");
    assert_eq!(count(&c, base, "big", "k").await, (huge + 100) as f64);
}
