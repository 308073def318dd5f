//! A stop while the stores hang or refuse: every namespace is pushed at once, and what
//! the stores did not confirm is spooled before `shutdown_grace` ends, so the next start
//! puts exactly what was acknowledged in the store.

use std::time::{Duration, Instant};

use swin_testkit::cluster::{within, TestStore};

use super::support::{increment, node, spool_files};

const NAMESPACES: [&str; 3] = ["a", "b", "c"];

fn config(head: &str, section: &str) -> String {
    let mut c = format!("{head}\n{section}\n");
    for ns in NAMESPACES {
        c += &format!(
            "[[namespaces]]\nname = \"{ns}\"\nstore = \"main\"\nwindow_sizes = [3600]\nsync_rate = 0.2\n"
        );
    }
    c
}

/// `n` increments of `k` in each namespace, all acknowledged.
/// `n` increments of `k` in each namespace, all acknowledged.
async fn hit_all(client: &reqwest::Client, base: &str, n: usize) {
    for ns in NAMESPACES {
        increment(client, base, ns, "k", n).await;
    }
}

async fn all_in_store(backend: &TestStore, n: f64) -> bool {
    for ns in NAMESPACES {
        if backend.totals(ns).await.get("k") != Some(&n) {
            return false;
        }
    }
    true
}

/// 10 hits per namespace in the store, the store made to hang or refuse, 25 more each,
/// SIGTERM: the node exits 0 within `shutdown_grace` (plus the requests' grace, none in
/// flight) with one spool; back, a new start brings each namespace to exactly 35.
async fn stop_with_the_store_away(
    backend: TestStore,
    away: impl FnOnce(),
    back: impl FnOnce(),
    head: &str,
    grace: Duration,
) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(head, &backend.section())).expect("write");
    let client = reqwest::Client::new();
    let mut n = node(&path);
    hit_all(&client, &n.base, 10).await;
    within(
        Duration::from_secs(15),
        "10 each in the store",
        async || all_in_store(&backend, 10.0).await,
    )
    .await;
    away();
    hit_all(&client, &n.base, 25).await;
    let t = Instant::now();
    assert!(n.terminate(), "exit 0: everything unconfirmed was spooled");
    let took = t.elapsed();
    assert!(
        took < grace + Duration::from_secs(2),
        "stopped within the grace: {took:?}"
    );
    assert_eq!(
        spool_files(dir.path()).len(),
        1,
        "one spool for every namespace"
    );
    back();
    let mut again = node(&path);
    within(
        Duration::from_secs(20),
        "35 each in the store",
        async || all_in_store(&backend, 35.0).await,
    )
    .await;
    assert!(again.terminate());
    for ns in NAMESPACES {
        assert_eq!(
            backend.totals(ns).await.get("k"),
            Some(&35.0),
            "{ns}: exactly what was acknowledged"
        );
    }
}

/// A Redis that hangs (SIGSTOP): every call waits its `store_timeout`. Three namespaces
/// one after another used to need 3 × 3 × 2 s against a grace of 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_a_hanging_redis_spools_every_namespace() {
    let port = swin_testkit::free_port();
    let dir = tempfile::tempdir().expect("dir");
    let server = swin_testkit::start_redis(port, dir.path());
    let backend = TestStore::redis_at(&format!("redis://127.0.0.1:{port}"), "swin");
    stop_with_the_store_away(
        backend,
        || server.signal("STOP"),
        || server.signal("CONT"),
        "store_timeout = 2\nshutdown_grace = 3",
        Duration::from_secs(3),
    )
    .await;
    drop(server);
}

/// A PostgreSQL that is down: the pool keeps trying to connect until each call's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_postgres_down_spools_every_namespace() {
    let pg = std::sync::Arc::new(swin_testkit::EphemeralPostgres::init());
    pg.start();
    let backend = TestStore::postgres_at(&pg.url());
    let (p1, p2) = (pg.clone(), pg.clone());
    stop_with_the_store_away(
        backend,
        move || p1.stop(),
        move || p2.start(),
        "",
        Duration::from_secs(10),
    )
    .await;
}

/// A stop while the store hangs, its grace (2 s) shorter than the store timeout (5 s),
/// with an extend's outcome unknown: every call under way ends at the stop's deadline,
/// so the engine's last push and the extend are spooled and the process exits 0 (the
/// engine used to outwait the grace: its hits and the extend were dropped, exit 1);
/// the next start pushes the hits, resolves the extend once, and a commit of what was
/// used leaves exactly that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_shorter_than_the_store_timeout_spools_what_is_owed() {
    let port = swin_testkit::free_port();
    let dir = tempfile::tempdir().expect("dir");
    let server = swin_testkit::start_redis(port, dir.path());
    let backend = TestStore::redis_at(&format!("redis://127.0.0.1:{port}"), "swin");
    let relay = swin_testkit::Relay::to_url(&backend.url).await;
    let path = dir.path().join("swin.toml");
    let text = format!(
        "store_timeout = 5\nanswer_timeout = 0.5\nshutdown_grace = 2\n{}\n\
         [[namespaces]]\nname = \"t\"\nstore = \"main\"\nwindow_sizes = [86400]\n\
         sync_rate = 0\nlimits = [{{ window_size = 86400, limit = 1000 }}]\n",
        backend.section_via(&relay)
    );
    std::fs::write(&path, text).expect("config");
    let mut n = node(&path);
    let c = reqwest::Client::new();
    let call = async |base: &str, op: &str, body: serde_json::Value| {
        let r = c
            .post(format!("{base}/v1/namespaces/t/{op}"))
            .json(&body)
            .send()
            .await
            .expect("send");
        let status = r.status().as_u16();
        (status, r.json::<serde_json::Value>().await.expect("json"))
    };
    let (s, v) = call(
        &n.base,
        "reserve",
        serde_json::json!({"keys": ["k"], "cost": 100}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let rid = v["reservation"].as_str().expect("id").to_owned();
    within(Duration::from_secs(10), "the reserve pushed", async || {
        backend.totals("t").await.get("k") == Some(&100.0)
    })
    .await;
    // the extend's replies lost (the store applies it), then the store hangs
    for _ in 0..10_000 {
        relay.lose_reply_to(&[b"cost-reservation", b"\r\nextend\r\n"]);
    }
    let more = serde_json::json!({"reservation": rid, "cost": 50});
    let (s, v) = call(&n.base, "extend", more).await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (503, Some("outcome_unknown")),
        "{v}"
    );
    server.signal("STOP");
    relay.disarm();
    let t = Instant::now();
    assert!(n.terminate(), "everything owed spooled: exits 0");
    eprintln!("stopped in {:?}", t.elapsed());
    assert!(!spool_files(dir.path()).is_empty(), "spooled");
    server.signal("CONT");
    let n = node(&path);
    let commit = serde_json::json!({"reservation": rid, "cost": 150});
    let (s, v) = call(&n.base, "commit", commit).await;
    assert_eq!((s, &v["estimate"]), (200, &serde_json::json!(150.0)), "{v}");
    let mut n = n;
    assert!(n.terminate(), "stops cleanly");
    assert_eq!(
        backend.totals("t").await.get("k"),
        Some(&150.0),
        "what was used, once"
    );
    drop(server);
}
