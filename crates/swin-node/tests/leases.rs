//! Concurrency leases across three node processes, on every store: many clients acquiring
//! and releasing on random nodes never hold more than the limit (the test holds every
//! lease it was granted and checks its count at each grant), a slot released on one node
//! is taken on another at once, a lease renewed on another node keeps its slots, leases
//! lapse after their ttl, and a node killed with leases held frees them by their lapse.
//! Both a periodic (200 ms) and a synchronous namespace: leases do not wait for syncs.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use swin_testkit::cluster::{key_call as post, use_node_binary, Node, TestStore};

const LIMIT: u64 = 4;

fn config(store: &TestStore) -> String {
    // three nodes and twelve clients on one SQLite file wait for its write lock longer
    // than answer_timeout's half second in a debug build: this test is about exclusion,
    // so each call may wait its whole store_timeout
    format!(
        "store_timeout = 2\nanswer_timeout = 2\n{}
[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = {LIMIT}
lease_ttl = 30
sync_rate = 0.2
store = \"main\"

[[namespaces]]
name = \"now\"
algorithm = \"concurrency\"
limit = {LIMIT}
sync_rate = 0
store = \"main\"
",
        store.section()
    )
}

fn start(dir: &Path, store: &TestStore, name: &str) -> Node {
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, config(store)).expect("config");
    Node::spawn(&path)
}

async fn acquire(
    c: &reqwest::Client,
    base: &str,
    ns: &str,
    key: &str,
    body: serde_json::Value,
) -> Option<String> {
    let body_count = body["count"].as_u64();
    let (s, v) = post(c, base, ns, key, "acquire", body).await;
    match s {
        200 => {
            assert!(v["in_flight"].as_u64().expect("in_flight") <= LIMIT, "{v}");
            Some(v["lease"].as_str().expect("lease").to_owned())
        }
        429 => {
            let count = body_count.unwrap_or(1);
            let in_flight = v["in_flight"].as_u64().expect("in_flight");
            assert!(
                in_flight + count > LIMIT && in_flight <= LIMIT,
                "denied only when full: {v}"
            );
            None
        }
        other => panic!("acquire answered {other}: {v}"),
    }
}

async fn release(c: &reqwest::Client, base: &str, ns: &str, key: &str, lease: &str) -> u16 {
    post(
        c,
        base,
        ns,
        key,
        "release",
        serde_json::json!({"lease": lease}),
    )
    .await
    .0
}

/// Clients on random nodes, each holding what it was granted for a moment: at no grant
/// do the test's held leases pass the limit, and every release is accepted once (sent
/// again, it is told the lease was released: `replayed`).
async fn never_past_the_limit(bases: &[String], ns: &str) -> u64 {
    let held = Arc::new(AtomicU64::new(0));
    let granted = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for t in 0..12u64 {
        let (bases, held, granted) = (bases.to_vec(), held.clone(), granted.clone());
        let ns = ns.to_owned();
        tasks.push(tokio::spawn(async move {
            let c = reqwest::Client::new();
            let until = Instant::now() + Duration::from_secs(3);
            let mut i = t;
            while Instant::now() < until {
                i += 7;
                let on = &bases[(i % 3) as usize];
                let count = 1 + (i % 2);
                let body = serde_json::json!({"count": count});
                if let Some(lease) = acquire(&c, on, &ns, "hot", body).await {
                    let now_held = held.fetch_add(count, Ordering::SeqCst) + count;
                    assert!(
                        now_held <= LIMIT,
                        "{now_held} slots held at once, limit {LIMIT}"
                    );
                    granted.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(i % 15)).await;
                    // given up before the release: the store still counts it until then
                    held.fetch_sub(count, Ordering::SeqCst);
                    let other = &bases[((i + 1) % 3) as usize];
                    assert_eq!(
                        release(&c, other, &ns, "hot", &lease).await,
                        200,
                        "released once"
                    );
                    // sent again (as after a lost answer): told it was released by
                    // another release, nothing freed again
                    let again = serde_json::json!({"lease": lease});
                    let (s, v) = post(&c, on, &ns, "hot", "release", again).await;
                    assert_eq!((s, &v["replayed"]), (200, &true.into()), "only once: {v}");
                } else {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    granted.load(Ordering::Relaxed)
}

/// `swin_leases_in_flight` of each namespace, as `base`'s `/metrics` shows it.
async fn in_flight_metric(c: &reqwest::Client, base: &str) -> Vec<(String, f64)> {
    let text = swin_testkit::cluster::metrics_text(c, base).await;
    ["now", "slots"]
        .iter()
        .filter_map(|ns| {
            let series = format!("swin_leases_in_flight{{namespace=\"{ns}\"}}");
            let v = swin_testkit::cluster::metric_value(&text, &series)?;
            Some((ns.to_string(), v))
        })
        .collect()
}

async fn leases_across_nodes(store: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let nodes: Vec<Node> = ["a", "b", "c"]
        .iter()
        .map(|n| start(dir.path(), &store, n))
        .collect();
    let bases: Vec<String> = nodes.iter().map(|n| n.base.clone()).collect();
    let (a, b, cc) = (&bases[0], &bases[1], &bases[2]);
    let c = reqwest::Client::new();
    let kind = store.store.kind();

    for ns in ["slots", "now"] {
        let granted = never_past_the_limit(&bases, ns).await;
        println!("{kind} {ns}: {granted} leases granted in 3 s by 12 clients on 3 nodes, never past {LIMIT}");
        assert!(granted > 20, "{kind} {ns}: only {granted} granted");
        // everything was released: the whole limit is free again, and no more
        let all = acquire(&c, a, ns, "hot", serde_json::json!({"count": LIMIT})).await;
        assert!(
            all.is_some(),
            "{kind} {ns}: every slot free after the releases"
        );
        assert_eq!(acquire(&c, b, ns, "hot", serde_json::json!({})).await, None);
        assert_eq!(release(&c, cc, ns, "hot", &all.unwrap()).await, 200);
    }

    // a slot released on one node is free on another at once
    let mut leases = Vec::new();
    for base in [a, b, cc, a] {
        leases.push(
            acquire(&c, base, "slots", "k", serde_json::json!({}))
                .await
                .expect("room"),
        );
    }
    assert_eq!(
        acquire(&c, b, "slots", "k", serde_json::json!({})).await,
        None,
        "full"
    );
    assert_eq!(release(&c, cc, "slots", "k", &leases[0]).await, 200);
    let again = acquire(&c, b, "slots", "k", serde_json::json!({})).await;
    assert!(
        again.is_some(),
        "{kind}: B takes the slot C released, at once"
    );
    // what every node's metrics show in flight: the cluster's slots, not its own
    for base in [a, b, cc] {
        assert_eq!(
            in_flight_metric(&c, base).await,
            vec![("now".to_owned(), 0.0), ("slots".to_owned(), LIMIT as f64)],
            "{kind} {base}"
        );
    }
    // renewed on another node, a lease keeps its slots past its first lapse
    let (s, v) = post(
        &c,
        b,
        "slots",
        "r",
        "acquire",
        serde_json::json!({"count": LIMIT, "ttl": 1}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let lease = v["lease"].as_str().expect("lease").to_owned();
    let (s, v) = post(
        &c,
        cc,
        "slots",
        "r",
        "renew",
        serde_json::json!({"lease": lease, "ttl": 30}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        acquire(&c, a, "slots", "r", serde_json::json!({})).await,
        None,
        "{kind}: renewed"
    );
    assert_eq!(release(&c, a, "slots", "r", &lease).await, 200);

    // a lease not released lapses after its ttl, on every node
    let (s, v) = post(
        &c,
        a,
        "now",
        "l",
        "acquire",
        serde_json::json!({"count": LIMIT, "ttl": 1}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        acquire(&c, b, "now", "l", serde_json::json!({})).await,
        None
    );
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(
        acquire(&c, cc, "now", "l", serde_json::json!({"count": LIMIT}))
            .await
            .is_some(),
        "{kind}: lapsed"
    );
    let lease = v["lease"].as_str().expect("lease");
    assert_eq!(
        release(&c, b, "now", "l", lease).await,
        404,
        "{kind}: a lapsed lease is gone"
    );

    // a node killed with leases held: they count until their lapse, then are free
    let (s, v) = post(
        &c,
        a,
        "slots",
        "dead",
        "acquire",
        serde_json::json!({"count": LIMIT, "ttl": 2}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let lapse = v["expires_at"].as_f64().expect("expires_at");
    nodes[0].signal("KILL");
    assert_eq!(
        acquire(&c, b, "slots", "dead", serde_json::json!({})).await,
        None,
        "{kind}: held after the kill"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64((lapse - now).max(0.0) + 0.1)).await;
    assert!(
        acquire(&c, cc, "slots", "dead", serde_json::json!({"count": LIMIT}))
            .await
            .is_some(),
        "{kind}: the dead node's leases lapsed"
    );
    drop(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_postgres() {
    leases_across_nodes(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_redis() {
    leases_across_nodes(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_redis_cluster() {
    leases_across_nodes(TestStore::redis_cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_sqlite() {
    leases_across_nodes(TestStore::sqlite().await).await;
}
