//! Idempotency records for everyone, not for one client: a batch's record is kept where
//! every node sees it (its first namespace with a store; a batch of local-only
//! namespaces sent with the header is 400), a client past its share of a namespace's
//! records is 429 while every other client's keys still work, and a dry run keeps no
//! record. Every case reads the store's own totals and records.

use swin_testkit::cluster::Node;
use swin_testkit::TestStore;

use super::grpc::sha256;
use super::support::node_in;

/// A namespace `name` on the store `main` (`None`: local only), 1,000 hits a day, with
/// its idempotency settings `extra`.
fn namespace(name: &str, store: Option<&str>, extra: &str) -> String {
    let sync = match store {
        Some(s) => format!("sync_rate = 0\nstore = \"{s}\""),
        None => "sync_rate = -1".into(),
    };
    format!(
        "
[[namespaces]]
name = \"{name}\"
window_sizes = [86400]
{sync}
limits = [{{ window_size = 86400, limit = 1000 }}]
{extra}
"
    )
}

/// What a client sends: its bearer token and its `X-Forwarded-For`, if any.
#[derive(Default, Clone, Copy)]
struct Sender<'a> {
    token: Option<&'a str>,
    forwarded: Option<&'a str>,
}

/// POSTs `body` to `url` under `key`: the status, the body and whether it was replayed.
async fn send(
    c: &reqwest::Client,
    url: &str,
    key: &str,
    from: Sender<'_>,
    body: serde_json::Value,
) -> (u16, String, bool) {
    let mut r = c.post(url).json(&body).header("idempotency-key", key);
    if let Some(t) = from.token {
        r = r.bearer_auth(t);
    }
    if let Some(f) = from.forwarded {
        r = r.header("x-forwarded-for", f);
    }
    let r = r.send().await.expect("send");
    let replayed = r.headers().get("idempotent-replayed").is_some();
    (r.status().as_u16(), r.text().await.expect("body"), replayed)
}

async fn total(store: &TestStore, ns: &str, key: &str) -> f64 {
    store.totals(ns).await.get(key).copied().unwrap_or(0.0)
}

/// What a node counted of `key` in its local-only namespace `ns` today.
async fn counted_on(c: &reqwest::Client, base: &str, ns: &str, key: &str) -> f64 {
    let url = format!("{base}/v1/namespaces/{ns}/keys/{key}?window_size=86400");
    let v: serde_json::Value = c
        .get(url)
        .send()
        .await
        .expect("send")
        .json()
        .await
        .expect("json");
    v["windows"][0]["current"].as_f64().expect("current")
}

async fn records(store: &TestStore, ns: &str) -> u64 {
    store
        .store
        .idempotency_records(ns, swin_sync::now())
        .await
        .expect("records")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_led_by_a_local_only_namespace_runs_once_across_nodes() {
    let store = TestStore::redis();
    let config = format!(
        "{}{}{}{}",
        store.section(),
        namespace("local", None, ""),
        namespace("local2", None, ""),
        namespace("shared", Some("main"), "")
    );
    let dir = tempfile::tempdir().expect("dir");
    let (a, b): (Node, Node) = (node_in(dir.path(), &config), node_in(dir.path(), &config));
    let c = reqwest::Client::new();
    let hits = serde_json::json!({"hits": [
        {"namespace": "local", "key": "k", "cost": 2},
        {"namespace": "shared", "key": "k", "cost": 3},
    ]});
    let incs = serde_json::json!({"increments": [
        {"namespace": "local", "key": "i", "value": 4},
        {"namespace": "shared", "key": "i", "value": 5},
    ]});
    let mut replays = Vec::new();
    for (route, body) in [("hits", &hits), ("increments", &incs)] {
        let mut seen = Vec::new();
        for base in [&a.base, &b.base, &a.base, &b.base, &b.base] {
            let url = format!("{base}/v1/{route}");
            seen.push(send(&c, &url, "batch-1", Sender::default(), body.clone()).await);
        }
        assert!(seen.iter().all(|s| s.0 == 200), "{seen:?}");
        replays.push((route, seen.iter().filter(|s| s.2).count(), seen));
    }
    assert_eq!(
        total(&store, "shared", "k").await,
        3.0,
        "hits: counted once"
    );
    assert_eq!(total(&store, "shared", "i").await, 5.0, "increments: once");
    for (route, replayed, seen) in replays {
        assert_eq!(replayed, 4, "{route}: run once, replayed 4 times: {seen:?}");
        assert!(seen.iter().all(|s| s.1 == seen[0].1), "{seen:?}");
    }
    // the local-only items counted once, on the node that ran the batch
    assert_eq!(counted_on(&c, &a.base, "local", "k").await, 2.0);
    assert_eq!(counted_on(&c, &b.base, "local", "k").await, 0.0);
    assert_eq!(counted_on(&c, &a.base, "local", "i").await, 4.0);
    assert_eq!(counted_on(&c, &b.base, "local", "i").await, 0.0);

    // no namespace with a store: with the header, refused naming why; without, served
    let only_local = serde_json::json!({"hits": [
        {"namespace": "local", "key": "o", "cost": 1},
        {"namespace": "local2", "key": "o", "cost": 1},
    ]});
    let url = format!("{}/v1/hits", a.base);
    let (status, body, _) = send(&c, &url, "batch-2", Sender::default(), only_local.clone()).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("Idempotency-Key") && body.contains("store") && body.contains("local2"),
        "{body}"
    );
    assert_eq!(
        counted_on(&c, &a.base, "local", "o").await,
        0.0,
        "nothing ran"
    );
    let plain = c.post(&url).json(&only_local).send().await.expect("send");
    assert_eq!(plain.status().as_u16(), 200);
    assert_eq!(counted_on(&c, &a.base, "local", "o").await, 1.0);
}

/// 30 new keys of a client with a share of 5 (of 20): 5 run, 25 are 429 naming the cap.
async fn fill_share(c: &reqwest::Client, bases: [&str; 2], from: Sender<'_>) {
    let mut ran = 0;
    for i in 0..30 {
        let url = format!("{}/v1/namespaces/shared/keys/k/hit", bases[i % 2]);
        let key = format!("greedy-{i}");
        let (status, body, _) = send(c, &url, &key, from, serde_json::json!({"cost": 1})).await;
        match status {
            200 => ran += 1,
            429 => assert!(
                body.contains("exhausted") && body.contains("idempotency_max_keys_per_client"),
                "{body}"
            ),
            _ => panic!("{status} {body}"),
        }
    }
    assert_eq!(ran, 5, "the client's share, across both nodes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_past_its_share_leaves_room_for_every_other_token() {
    let store = TestStore::redis();
    let token = |name: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"decide\", \"count\"]\n",
            sha256(&format!("{name}-secret-token"))
        )
    };
    let share = "idempotency_max_keys = 20\nidempotency_max_keys_per_client = 5";
    let config = format!(
        "{}{}{}{}",
        token("greedy"),
        token("other"),
        store.section(),
        namespace("shared", Some("main"), share)
    );
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = (node_in(dir.path(), &config), node_in(dir.path(), &config));
    let c = reqwest::Client::new();
    let greedy = Sender {
        token: Some("greedy-secret-token"),
        ..Sender::default()
    };
    fill_share(&c, [&a.base, &b.base], greedy).await;
    // the other token's keys run, on either node, and are answered again
    let other = Sender {
        token: Some("other-secret-token"),
        ..Sender::default()
    };
    for (i, base) in [&a.base, &b.base, &a.base].into_iter().enumerate() {
        let url = format!("{base}/v1/namespaces/shared/keys/k/hit");
        let (status, body, replayed) = send(
            &c,
            &url,
            &format!("other-{i}"),
            other,
            serde_json::json!({"cost": 1}),
        )
        .await;
        assert_eq!((status, replayed), (200, false), "{body}");
    }
    // the greedy client's kept keys still answer
    let url = format!("{}/v1/namespaces/shared/keys/k/hit", b.base);
    let (status, _, replayed) =
        send(&c, &url, "greedy-0", greedy, serde_json::json!({"cost": 1})).await;
    assert_eq!((status, replayed), (200, true));
    assert_eq!(
        total(&store, "shared", "k").await,
        8.0,
        "5 of greedy's, 3 of other's"
    );
    assert_eq!(records(&store, "shared").await, 8);
}

/// Two tokens under one idempotency key, with the same body: each is its own request,
/// run and counted once (the second token used to be answered the first's answer, its
/// hit never counted), and each token's retry is answered its own first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tokens_idempotency_keys_are_its_own() {
    let store = TestStore::redis();
    let token = |name: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = [\"decide\", \"count\"]\n",
            sha256(&format!("{name}-secret-token"))
        )
    };
    let config = format!(
        "{}{}{}{}",
        token("one"),
        token("two"),
        store.section(),
        namespace("shared", Some("main"), "")
    );
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = (node_in(dir.path(), &config), node_in(dir.path(), &config));
    let c = reqwest::Client::new();
    let from = |t| Sender {
        token: Some(t),
        ..Sender::default()
    };
    let (one, two) = (from("one-secret-token"), from("two-secret-token"));
    let body = serde_json::json!({"cost": 3});
    let mut seen = Vec::new();
    for (base, who) in [
        (&a.base, one),
        (&b.base, two),
        (&b.base, one),
        (&a.base, two),
    ] {
        let url = format!("{base}/v1/namespaces/shared/keys/k/hit");
        seen.push(send(&c, &url, "order-1", who, body.clone()).await);
    }
    let replayed: Vec<bool> = seen.iter().map(|s| s.2).collect();
    assert!(seen.iter().all(|s| s.0 == 200), "{seen:?}");
    assert_eq!(replayed, [false, false, true, true], "{seen:?}");
    // each retry is its own token's first answer
    assert_eq!(seen[2].1, seen[0].1);
    assert_eq!(seen[3].1, seen[1].1);
    assert_eq!(total(&store, "shared", "k").await, 6.0, "two runs of 3");
    assert_eq!(records(&store, "shared").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_a_client_is_its_address() {
    let store = TestStore::postgres().await;
    let share = "idempotency_max_keys = 20\nidempotency_max_keys_per_client = 5";
    let config = format!(
        "trusted_proxies = [\"127.0.0.1/32\", \"::1/128\"]\n{}{}",
        store.section(),
        namespace("shared", Some("main"), share)
    );
    let dir = tempfile::tempdir().expect("dir");
    let (a, b) = (node_in(dir.path(), &config), node_in(dir.path(), &config));
    let c = reqwest::Client::new();
    let from = |ip| Sender {
        forwarded: Some(ip),
        ..Sender::default()
    };
    fill_share(&c, [&a.base, &b.base], from("203.0.113.7")).await;
    let url = format!("{}/v1/namespaces/shared/keys/k/hit", b.base);
    let (status, body, _) = send(
        &c,
        &url,
        "k-1",
        from("203.0.113.8"),
        serde_json::json!({"cost": 1}),
    )
    .await;
    assert_eq!(status, 200, "another address has room: {body}");
    assert_eq!(total(&store, "shared", "k").await, 6.0);
    assert_eq!(records(&store, "shared").await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_runs_keep_no_record() {
    let store = TestStore::postgres().await;
    let config = format!(
        "{}{}",
        store.section(),
        namespace("shared", Some("main"), "idempotency_max_keys = 5")
    );
    let dir = tempfile::tempdir().expect("dir");
    let a = node_in(dir.path(), &config);
    let c = reqwest::Client::new();
    let url = format!("{}/v1/namespaces/shared/keys/k/hit", a.base);
    let batch = format!("{}/v1/hits", a.base);
    let dry = serde_json::json!({"cost": 1, "dry_run": true});
    let dry_batch =
        serde_json::json!({"hits": [{"namespace": "shared", "key": "k"}], "dry_run": true});
    for i in 0..50 {
        let key = format!("dry-{i}");
        let (status, body, replayed) = send(&c, &url, &key, Sender::default(), dry.clone()).await;
        assert_eq!((status, replayed), (200, false), "{i}: {body}");
        let (status, body, _) = send(&c, &batch, &key, Sender::default(), dry_batch.clone()).await;
        assert_eq!(status, 200, "{i}: {body}");
    }
    // a dry run sent again is another dry run, not a replay
    let (_, _, replayed) = send(&c, &url, "dry-0", Sender::default(), dry.clone()).await;
    assert!(!replayed);
    assert_eq!(
        records(&store, "shared").await,
        0,
        "100 dry runs, no record"
    );
    assert_eq!(total(&store, "shared", "k").await, 0.0);
    // the namespace's records are all there for what counts
    for i in 0..5 {
        let key = format!("real-{i}");
        let (status, body, _) = send(
            &c,
            &url,
            &key,
            Sender::default(),
            serde_json::json!({"cost": 1}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(records(&store, "shared").await, 5);
    assert_eq!(total(&store, "shared", "k").await, 5.0);
}
