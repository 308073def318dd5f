//! Idempotent retries across a cluster: a request retried under its `Idempotency-Key` on
//! another node answers the first answer (status, body, RateLimit headers) and counts
//! nothing more; the same key in two namespaces is two records; another body is 422;
//! duplicates racing on two nodes count once; a bad header is refused naming it; and a
//! namespace past its cap of records refuses new keys while its kept ones answer. Every
//! case reads the store's own totals.

use swin_testkit::cluster::Node;
use swin_testkit::TestStore;

use super::support::node_in;

fn config(store: &TestStore, max_keys: u64) -> String {
    let ns = |name: &str| {
        format!(
            "
[[namespaces]]
name = \"{name}\"
window_sizes = [86400]
sync_rate = 0
store = \"main\"
limits = [{{ window_size = 86400, limit = 1000 }}]
idempotency_max_keys = {max_keys}
"
        )
    };
    let jobs = "
[[namespaces]]
name = \"jobs\"
algorithm = \"concurrency\"
limit = 2
sync_rate = 1
store = \"main\"
";
    format!(
        "store_timeout = 2\n{}{}{}{jobs}",
        store.section(),
        ns("a"),
        ns("b")
    )
}

/// Two nodes of one cluster on `store`.
fn two_nodes(store: &TestStore, max_keys: u64) -> (Node, Node, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("dir");
    let a = node_in(dir.path(), &config(store, max_keys));
    let b = node_in(dir.path(), &config(store, max_keys));
    (a, b, dir)
}

/// What a client compares between a first answer and its retry.
#[derive(Debug, PartialEq)]
struct Seen {
    status: u16,
    body: String,
    ratelimit: Vec<(String, String)>,
}

async fn send(
    c: &reqwest::Client,
    url: &str,
    keys: &[&[u8]],
    body: serde_json::Value,
) -> (Seen, bool) {
    let mut r = c.post(url).json(&body);
    for k in keys {
        r = r.header(
            "idempotency-key",
            reqwest::header::HeaderValue::from_bytes(k).expect("value"),
        );
    }
    let r = r.send().await.expect("send");
    let replayed = r.headers().get("idempotent-replayed").is_some();
    let mut ratelimit: Vec<(String, String)> = r
        .headers()
        .iter()
        .filter(|(n, _)| n.as_str().starts_with("ratelimit") || n.as_str() == "retry-after")
        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    ratelimit.sort();
    let status = r.status().as_u16();
    let body = r.text().await.expect("body");
    (
        Seen {
            status,
            body,
            ratelimit,
        },
        replayed,
    )
}

async fn total(store: &TestStore, ns: &str, key: &str) -> f64 {
    store.totals(ns).await.get(key).copied().unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_on_another_node_answers_the_first_answer_and_counts_nothing_more() {
    let store = TestStore::redis();
    let (a, b, _dir) = two_nodes(&store, 1000);
    let c = reqwest::Client::new();
    let hit = |base: &str| format!("{base}/v1/namespaces/a/keys/k/hit");
    let (first, replayed) =
        send(&c, &hit(&a.base), &[b"h-1"], serde_json::json!({"cost": 3})).await;
    assert_eq!((first.status, replayed), (200, false), "{first:?}");
    assert!(!first.ratelimit.is_empty(), "{first:?}");
    // another hit between, so that the key's state moved on
    let (other, _) = send(&c, &hit(&b.base), &[b"h-2"], serde_json::json!({"cost": 1})).await;
    assert_eq!(other.status, 200);
    for base in [&b.base, &a.base] {
        let (again, replayed) =
            send(&c, &hit(base), &[b"h-1"], serde_json::json!({"cost": 3})).await;
        assert!(replayed, "{again:?}");
        assert_eq!(again, first, "the first answer, as it was");
    }
    assert_eq!(total(&store, "a", "k").await, 4.0, "3 + 1, each once");

    // reserve, then a commit whose answer was lost: the retry on the other node gets it
    let url = |base: &str, op: &str| format!("{base}/v1/namespaces/a/keys/r/{op}");
    let (reserved, _) = send(
        &c,
        &url(&a.base, "reserve"),
        &[b"r-1"],
        serde_json::json!({"cost": 100}),
    )
    .await;
    assert_eq!(reserved.status, 200, "{reserved:?}");
    let (again, replayed) = send(
        &c,
        &url(&b.base, "reserve"),
        &[b"r-1"],
        serde_json::json!({"cost": 100}),
    )
    .await;
    assert!(replayed && again == reserved, "{again:?}");
    let id = serde_json::from_str::<serde_json::Value>(&reserved.body).expect("json")
        ["reservation"]
        .as_str()
        .expect("id")
        .to_owned();
    let commit = serde_json::json!({"reservation": id, "cost": 30});
    let (committed, _) = send(&c, &url(&a.base, "commit"), &[b"c-1"], commit.clone()).await;
    assert_eq!(committed.status, 200, "{committed:?}");
    let (again, replayed) = send(&c, &url(&b.base, "commit"), &[b"c-1"], commit.clone()).await;
    assert!(replayed, "{again:?}");
    assert_eq!(
        again, committed,
        "not 404 unknown_reservation: the first answer"
    );
    assert_eq!(
        total(&store, "a", "r").await,
        30.0,
        "reserved 100 once, settled at 30 once"
    );

    // a batch of hits and a batch of increments, retried on the other node
    let batch = serde_json::json!({"hits": [{"namespace": "a", "key": "x", "cost": 2}, {"namespace": "b", "key": "x", "cost": 5}]});
    let (first, _) = send(
        &c,
        &format!("{}/v1/hits", a.base),
        &[b"batch"],
        batch.clone(),
    )
    .await;
    let (again, replayed) = send(&c, &format!("{}/v1/hits", b.base), &[b"batch"], batch).await;
    assert!(
        first.status == 200 && replayed && again == first,
        "{first:?} {again:?}"
    );
    let incs = serde_json::json!({"increments": [{"namespace": "b", "key": "i", "value": 7}]});
    let (first, _) = send(
        &c,
        &format!("{}/v1/increments", a.base),
        &[b"batch"],
        incs.clone(),
    )
    .await;
    let (again, replayed) = send(&c, &format!("{}/v1/increments", b.base), &[b"batch"], incs).await;
    assert!(
        first.status == 200 && replayed && again == first,
        "{first:?} {again:?}"
    );
    let one = |ns: &str, key: &str, v: i64| {
        let url = format!("/v1/namespaces/{ns}/keys/{key}/increment");
        (url, serde_json::json!({ "value": v }))
    };
    let (path, body) = one("b", "j", 4);
    for base in [&a.base, &b.base, &a.base] {
        let (s, _) = send(&c, &format!("{base}{path}"), &[b"inc"], body.clone()).await;
        assert_eq!(s.status, 200);
    }
    assert_eq!(total(&store, "a", "x").await, 2.0);
    assert_eq!(total(&store, "b", "x").await, 5.0);
    assert_eq!(total(&store, "b", "i").await, 7.0);
    assert_eq!(total(&store, "b", "j").await, 4.0);
}

/// An acquire, a release and a refund sent again under their `Idempotency-Key` on
/// another node answer the first answer and change nothing more. The header used to be
/// passed over on these routes: an acquire's retry took a second slot, a refund's gave
/// back twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_and_refunds_sent_again_under_their_key_run_once() {
    let store = TestStore::redis();
    let (a, b, _dir) = two_nodes(&store, 1000);
    let c = reqwest::Client::new();
    let url = |base: &str, op: &str| format!("{base}/v1/namespaces/jobs/keys/j/{op}");
    let ask = serde_json::json!({"count": 1, "ttl": 60});
    let (first, _) = send(&c, &url(&a.base, "acquire"), &[b"acq-1"], ask.clone()).await;
    assert_eq!(first.status, 200, "{first:?}");
    let (again, replayed) = send(&c, &url(&b.base, "acquire"), &[b"acq-1"], ask.clone()).await;
    assert!(replayed && again == first, "{again:?}");
    // a limit of 2: one more lease fits, then none
    let (second, _) = send(&c, &url(&a.base, "acquire"), &[], ask.clone()).await;
    assert_eq!(second.status, 200, "one slot was left: {second:?}");
    let (third, _) = send(&c, &url(&b.base, "acquire"), &[], ask.clone()).await;
    assert_eq!(third.status, 429, "{third:?}");

    let lease = serde_json::from_str::<serde_json::Value>(&first.body).expect("json")["lease"]
        .as_str()
        .expect("lease")
        .to_owned();
    let release = serde_json::json!({ "lease": lease });
    let (released, _) = send(&c, &url(&a.base, "release"), &[b"rel-1"], release.clone()).await;
    assert_eq!(released.status, 200, "{released:?}");
    let (again, replayed) = send(&c, &url(&b.base, "release"), &[b"rel-1"], release).await;
    assert!(replayed && again == released, "{again:?}");

    let hit = |base: &str, op: &str| format!("{base}/v1/namespaces/a/keys/rf/{op}");
    let (spent, _) = send(
        &c,
        &hit(&a.base, "hit"),
        &[],
        serde_json::json!({"cost": 10}),
    )
    .await;
    assert_eq!(spent.status, 200);
    let back = serde_json::json!({"cost": 4});
    let (refunded, _) = send(&c, &hit(&a.base, "refund"), &[b"rf-1"], back.clone()).await;
    assert_eq!(refunded.status, 200, "{refunded:?}");
    let (again, replayed) = send(&c, &hit(&b.base, "refund"), &[b"rf-1"], back).await;
    assert!(replayed && again == refunded, "{again:?}");
    assert_eq!(
        total(&store, "a", "rf").await,
        6.0,
        "10 spent, 4 given back once"
    );
}

/// A key that is not one (U+0000, past 1,024 bytes) under an `Idempotency-Key` is 400
/// `invalid_key` and claims no record: PostgreSQL answered 503 `store_failed` (its text
/// cannot hold U+0000) and kept trying to release the claim; Redis kept a record of the
/// 400 and replayed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_is_not_one_under_an_idempotency_key_is_400_and_keeps_no_record() {
    for store in [TestStore::postgres().await, TestStore::redis()] {
        let (a, _b, _dir) = two_nodes(&store, 1000);
        let c = reqwest::Client::new();
        let long = "k".repeat(1025);
        for key in ["%00", "a%00b", long.as_str()] {
            let url = format!("{}/v1/namespaces/a/keys/{key}/hit", a.base);
            for _ in 0..2 {
                let (seen, replayed) =
                    send(&c, &url, &[b"bad-key"], serde_json::json!({"cost": 1})).await;
                let v: serde_json::Value = serde_json::from_str(&seen.body).expect("json");
                assert_eq!(
                    (seen.status, v["error"]["code"].as_str(), replayed),
                    (400, Some("invalid_key"), false),
                    "{key}: {seen:?}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_reused_across_namespaces_is_two_records_each_counted_once() {
    let store = TestStore::postgres().await;
    let (a, b, _dir) = two_nodes(&store, 1000);
    let c = reqwest::Client::new();
    for (ns, base) in [("a", &a.base), ("b", &b.base)] {
        let url = format!("{base}/v1/namespaces/{ns}/keys/k/hit");
        let (first, replayed) = send(&c, &url, &[b"same"], serde_json::json!({"cost": 2})).await;
        assert_eq!(
            (first.status, replayed),
            (200, false),
            "{ns}: a record of its own"
        );
    }
    for (ns, base) in [("a", &b.base), ("b", &a.base)] {
        let url = format!("{base}/v1/namespaces/{ns}/keys/k/hit");
        let (_, replayed) = send(&c, &url, &[b"same"], serde_json::json!({"cost": 2})).await;
        assert!(replayed, "{ns}");
    }
    assert_eq!(total(&store, "a", "k").await, 2.0);
    assert_eq!(total(&store, "b", "k").await, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_body_is_422_and_bad_headers_are_400_naming_the_header() {
    let store = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let a = node_in(dir.path(), &config(&store, 1000));
    let c = reqwest::Client::new();
    let url = format!("{}/v1/namespaces/a/keys/k/hit", a.base);
    let (first, _) = send(&c, &url, &[b"k-1"], serde_json::json!({"cost": 1})).await;
    assert_eq!(first.status, 200);
    let (reused, _) = send(&c, &url, &[b"k-1"], serde_json::json!({"cost": 5})).await;
    assert_eq!(reused.status, 422, "{reused:?}");
    assert!(reused.body.contains("idempotency_key_reused"), "{reused:?}");
    let other_route = format!("{}/v1/namespaces/a/keys/other/hit", a.base);
    let (elsewhere, _) = send(&c, &other_route, &[b"k-1"], serde_json::json!({"cost": 1})).await;
    assert_eq!(elsewhere.status, 200, "another route key is another record");
    let long = [b'x'; 256];
    for keys in [
        vec![&b""[..]],
        vec![&long[..]],
        vec![&b"a b"[..]],
        vec![&b"caf\xc3\xa9"[..]],
        vec![&b"a\tb"[..]],
        vec![&b"one"[..], &b"two"[..]],
    ] {
        let (bad, _) = send(&c, &url, &keys, serde_json::json!({"cost": 1})).await;
        assert_eq!(bad.status, 400, "{keys:?}: {bad:?}");
        assert!(bad.body.contains("Idempotency-Key"), "{keys:?}: {bad:?}");
    }
    let ok = [b'~'; 255];
    let (longest, _) = send(&c, &url, &[&ok[..]], serde_json::json!({"cost": 1})).await;
    assert_eq!(longest.status, 200, "{longest:?}");
    assert_eq!(
        total(&store, "a", "k").await,
        2.0,
        "the first hit and the 255-byte key's"
    );
    assert_eq!(total(&store, "a", "other").await, 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_racing_on_two_nodes_count_exactly_once() {
    let store = TestStore::redis();
    let (a, b, _dir) = two_nodes(&store, 1000);
    let c = reqwest::Client::new();
    for round in 0..5 {
        let key = format!("race-{round}");
        let racers: Vec<_> = (0..16)
            .map(|i| {
                let base = if i % 2 == 0 {
                    a.base.clone()
                } else {
                    b.base.clone()
                };
                let (c, key) = (c.clone(), key.clone());
                tokio::spawn(async move {
                    let url = format!("{base}/v1/namespaces/a/keys/k{round}/hit");
                    send(&c, &url, &[key.as_bytes()], serde_json::json!({"cost": 1})).await
                })
            })
            .collect();
        let mut answered = Vec::new();
        for r in racers {
            let (seen, _) = r.await.expect("racer");
            match seen.status {
                200 => answered.push(seen),
                409 => assert!(seen.body.contains("idempotency_in_progress"), "{seen:?}"),
                _ => panic!("{seen:?}"),
            }
        }
        assert!(!answered.is_empty());
        assert!(
            answered.iter().all(|s| *s == answered[0]),
            "one answer: {answered:?}"
        );
        assert_eq!(
            total(&store, "a", &format!("k{round}")).await,
            1.0,
            "round {round}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_cap_new_keys_are_refused_and_kept_ones_still_answer() {
    let store = TestStore::redis();
    let (a, b, _dir) = two_nodes(&store, 20);
    let c = reqwest::Client::new();
    let url = |base: &str| format!("{base}/v1/namespaces/a/keys/k/hit");
    let mut refused = 0;
    for i in 0..60 {
        let base = if i % 2 == 0 { &a.base } else { &b.base };
        let key = format!("key-{i}");
        let (s, _) = send(
            &c,
            &url(base),
            &[key.as_bytes()],
            serde_json::json!({"cost": 1}),
        )
        .await;
        match s.status {
            200 => {}
            503 => {
                assert!(
                    s.body.contains("idempotency_full") && s.body.contains("idempotency_max_keys"),
                    "{s:?}"
                );
                refused += 1;
            }
            _ => panic!("{s:?}"),
        }
    }
    assert_eq!(refused, 40, "the cap of 20 holds across both nodes");
    assert_eq!(
        total(&store, "a", "k").await,
        20.0,
        "refused keys counted nothing"
    );
    // a kept key still answers on either node; the other namespace has room of its own;
    // a request without a key is served as ever
    let (again, replayed) = send(
        &c,
        &url(&b.base),
        &[b"key-0"],
        serde_json::json!({"cost": 1}),
    )
    .await;
    assert!(again.status == 200 && replayed, "{again:?}");
    let other = format!("{}/v1/namespaces/b/keys/k/hit", a.base);
    let (s, _) = send(&c, &other, &[b"key-59"], serde_json::json!({"cost": 1})).await;
    assert_eq!(s.status, 200);
    let (s, _) = send(&c, &url(&a.base), &[], serde_json::json!({"cost": 1})).await;
    assert_eq!(s.status, 200);
    assert_eq!(total(&store, "a", "k").await, 21.0);
}

/// A million distinct idempotency keys, driven through the library: the cap holds, the
/// memory its records take stays under the bound docs/api.md states, the namespace keeps
/// answering, kept keys still answer and another namespace is untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_million_distinct_keys_hold_the_cap_and_the_memory_bound() {
    use std::sync::Arc;
    use swin::idempotency::{Answer, Idempotent, Once};

    const CAP: u64 = 10_000;
    const KEYS: u64 = 1_000_000;
    let dir = tempfile::tempdir().expect("dir");
    let ns = |name: &str| {
        format!(
            "[[namespaces]]\nname = \"{name}\"\nwindow_sizes = [3600]\nsync_rate = -1\nlimits = [{{ window_size = 3600, limit = 1000000000 }}]\nidempotency_max_keys = {CAP}\n"
        )
    };
    let text = format!("data_dir = {:?}\n{}{}", dir.path(), ns("a"), ns("b"));
    let limiter = Arc::new(
        swin::Limiter::start(swin::config::Config::from_toml(&text).expect("config"))
            .await
            .expect("start"),
    );
    let body = br#"{"cost":1}"#;
    let tasks: Vec<_> = (0..8u64)
        .map(|t| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                let (mut first, mut full) = (0u64, 0u64);
                for i in (t..KEYS).step_by(8) {
                    let key = format!("key-{i}");
                    let asked = Idempotent::new("a", "keys/k/hit", key.as_bytes(), "POST", body)
                        .expect("key");
                    let l = limiter.clone();
                    let run = async move {
                        let v = l.hit("a", "k", 1.0).await.expect("hit");
                        Answer::new(
                            200,
                            vec![],
                            format!("{}", v.decision().remaining).into_bytes(),
                        )
                    };
                    match limiter.once(asked, run).await {
                        Ok(o) => {
                            assert!(!matches!(o, Once::Again(_)));
                            first += 1;
                        }
                        Err(swin::error::Error::IdempotencyFull(_)) => full += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                (first, full)
            })
        })
        .collect();
    let (mut first, mut full) = (0, 0);
    for t in tasks {
        let (f, x) = t.await.expect("task");
        first += f;
        full += x;
    }
    assert_eq!((first, full), (CAP, KEYS - CAP));
    let (records, bytes) = limiter.local_records("a").expect("a");
    assert_eq!(records as u64, CAP);
    // the bound docs/api.md states for a node's own records: 128 bytes, the record's key
    // and its answer
    let per_key = bytes as f64 / CAP as f64;
    eprintln!("a local record: {per_key:.0} bytes");
    assert!(per_key <= (128 + 40 + 20 + 40) as f64, "{per_key}");
    // exactly what was admitted counted, in the key's current and previous windows
    // (a run that straddles a window's edge weighs the previous one less in what
    // remains, so the counts are read, not the remainder); the node keeps answering
    let w = limiter.rates("a", "k", Some(3600)).await.expect("rates");
    assert_eq!(w[0].current + w[0].previous, CAP as f64);
    assert!(limiter.check("a", "k", 1.0).await.expect("check").allowed());
    let kept = Idempotent::new("a", "keys/k/hit", b"key-0", "POST", body).expect("key");
    let replay = limiter
        .once(kept, async { Answer::new(500, vec![], vec![]) })
        .await
        .expect("kept");
    assert!(matches!(replay, Once::Again(_)) && replay.answer().status() == 200);
    let other = Idempotent::new("b", "keys/k/hit", b"key-5", "POST", body).expect("key");
    let fresh = limiter
        .once(other, async { Answer::new(200, vec![], vec![]) })
        .await
        .expect("b has room");
    assert!(!matches!(fresh, Once::Again(_)));
    limiter.stop().await.expect("stop");
}
