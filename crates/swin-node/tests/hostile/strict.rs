//! Strict admission while its store hangs (SIGSTOP): each hit is answered within
//! `store_timeout` (by `on_store_failure`), and once the store is known to be down the
//! hits after it are answered without waiting, as synchronous mode does. (Every hit
//! waited up to twice `store_timeout`: ~30 answers a second instead of ~1,500.)

use std::time::Duration;

async fn hangs(on_failure: &str, expect: u16) {
    let port = swin_testkit::free_port();
    let redis_dir = tempfile::tempdir().expect("dir");
    let redis = swin_testkit::start_redis(port, redis_dir.path());
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!(
            "store_timeout = 1\nshutdown_grace = 2\n[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\nprefix = \"swin\"\n\
             [[namespaces]]\nname = \"api\"\nwindow_sizes = [3600]\nsync_rate = 0.2\nstore = \"main\"\n\
             limits = [{{ window_size = 3600, limit = 100000 }}]\nadmission = \"strict\"\non_store_failure = \"{on_failure}\"\n"
        ),
    )
    .expect("write");
    let mut n = super::support::node(&path);
    // a client that gives up half a second past store_timeout
    let client = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .expect("client");
    let warm = client
        .post(format!("{}/v1/namespaces/api/keys/warm/hit", n.base))
        .send()
        .await
        .expect("answer");
    assert_eq!(warm.status(), 200);
    redis.signal("STOP");
    // eight clients for four seconds, new keys each time (none served from quota held)
    let deadline = tokio::time::Instant::now() + Duration::from_secs(4);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, base) = (client.clone(), n.base.clone());
            tokio::spawn(async move {
                let (mut codes, mut late) = (Vec::new(), 0);
                let mut i = 0;
                while tokio::time::Instant::now() < deadline && i < 100_000 {
                    let r = client
                        .post(format!("{base}/v1/namespaces/api/keys/w{w}k{i}/hit"))
                        .send()
                        .await;
                    match r {
                        Ok(r) => codes.push(r.status().as_u16()),
                        Err(_) => late += 1,
                    }
                    i += 1;
                }
                (codes, late)
            })
        })
        .collect();
    let (mut codes, mut late) = (Vec::new(), 0);
    for w in workers {
        let (c, l) = w.await.expect("worker");
        codes.extend(c);
        late += l;
    }
    redis.signal("CONT");
    eprintln!(
        "on_store_failure = {on_failure}: {} answers in 4 s while the store hangs, {late} later than store_timeout + 0.5 s",
        codes.len()
    );
    assert_eq!(late, 0, "hits not answered within store_timeout");
    assert!(
        codes.iter().all(|c| *c == expect),
        "on_store_failure = {on_failure}: {codes:?}"
    );
    assert!(n.terminate());
    drop(redis);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_admission_denies_within_store_timeout_while_the_store_hangs() {
    hangs("deny", 429).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_admission_decides_locally_within_store_timeout_while_the_store_hangs() {
    hangs("local", 200).await;
}

/// A hung store (SIGSTOP) with default settings (`store_timeout` 5 s) costs no request
/// more than a second, on every mode: each is answered within `answer_timeout` (0.5 s)
/// as its namespace's `on_store_failure` says, 8 clients on 300 keys each (strict
/// `deny` waited the whole 5 s). Once the store is back, every hit the eventual
/// namespaces acknowledged is in it, exactly: none lost, none counted twice by a round
/// trip that landed after its caller was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_store_costs_no_answer_more_than_a_second() {
    use swin_testkit::cluster::{within, TestStore};
    let own = super::support::OwnRedis::start(|store: &TestStore| {
        let ns = |name: &str, extra: &str| {
            format!(
                "[[namespaces]]\nname = \"{name}\"\nwindow_sizes = [3600]\nstore = \"main\"\n\
                 limits = [{{ window_size = 3600, limit = 1000000 }}]\n{extra}\n"
            )
        };
        format!(
            "shutdown_grace = 2\n{}{}{}{}{}",
            store.section(),
            ns(
                "deny",
                "sync_rate = 0.2\nadmission = \"strict\"\non_store_failure = \"deny\""
            ),
            ns(
                "local",
                "sync_rate = 0.2\nadmission = \"strict\"\non_store_failure = \"local\""
            ),
            ns("synchronous", "sync_rate = 0"),
            ns("periodic", "sync_rate = 0.2"),
        )
    });
    let base = own.node.base.clone();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(1))
        .build()
        .expect("client");
    for ns in ["deny", "local", "synchronous", "periodic"] {
        let r = client
            .post(format!("{base}/v1/namespaces/{ns}/keys/warm/hit"))
            .send()
            .await
            .expect("answer");
        assert_eq!(r.status(), 200, "{ns}");
    }
    own.server().signal("STOP");
    let modes = [
        ("deny", 429),
        ("local", 200),
        ("synchronous", 200),
        ("periodic", 200),
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(6);
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut slowest = Duration::ZERO;
                let mut i = 0;
                while tokio::time::Instant::now() < deadline && i < 20_000 {
                    let (ns, _) = modes[i % modes.len()];
                    let key = format!("w{w}k{}", i % 300);
                    let t = std::time::Instant::now();
                    let r = client
                        .post(format!("{base}/v1/namespaces/{ns}/keys/{key}/hit"))
                        .send()
                        .await;
                    slowest = slowest.max(t.elapsed());
                    seen.push((i % modes.len(), r.map(|r| r.status().as_u16()).ok()));
                    i += 1;
                }
                (seen, slowest)
            })
        })
        .collect();
    let mut seen = Vec::new();
    let mut slowest = Duration::ZERO;
    for w in workers {
        let (s, t) = w.await.expect("worker");
        seen.extend(s);
        slowest = slowest.max(t);
    }
    eprintln!(
        "hung store, default settings: {} answers in 6 s, slowest {slowest:?}",
        seen.len()
    );
    let late = seen.iter().filter(|(_, s)| s.is_none()).count();
    assert_eq!(late, 0, "answers later than a second (slowest {slowest:?})");
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    let mut admitted = [0u64; 4];
    for (m, status) in &seen {
        let (ns, want) = modes[*m];
        assert_eq!(*status, Some(want), "{ns}");
        if *status == Some(200) {
            admitted[*m] += 1;
        }
    }
    own.server().signal("CONT");
    // the eventual namespaces' hits (and the warm-up hit) all reach the store, once
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{}", own.port), "hostile");
    for (m, ns) in [(2, "synchronous"), (3, "periodic")] {
        let want = admitted[m] as f64 + 1.0;
        let mut total = 0.0;
        within(
            Duration::from_secs(20),
            "every acknowledged hit is stored",
            async || {
                total = store.totals(ns).await.values().sum();
                assert!(total <= want, "{ns}: {total} stored, {want} acknowledged");
                total == want
            },
        )
        .await;
    }
}

/// Under strict admission a dry run answers what a hit would: the quota this node holds
/// unused is its own to spend, not counted as used (a dry run answered 429 where the
/// same hit then passed). The store ends at the limit exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_answers_what_a_hit_would_under_strict_admission() {
    use swin_testkit::cluster::{key_call, TestStore};
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!(
            "{}\n[[namespaces]]\nname = \"api\"\nwindow_sizes = [3600]\nsync_rate = 0.2\nstore = \"main\"\n\
             limits = [{{ window_size = 3600, limit = 100 }}]\nadmission = \"strict\"\n",
            store.section()
        ),
    )
    .expect("write");
    let n = super::support::node(&path);
    let c = reqwest::Client::new();
    let hit = async |cost: u32, dry_run: bool| {
        let body = serde_json::json!({"cost": cost, "dry_run": dry_run});
        key_call(&c, &n.base, "api", "k", "hit", body).await
    };
    // hits of 1 until this node holds quota it has not used (the store counts what it
    // holds)
    let mut used = 0;
    loop {
        let (s, v) = hit(1, false).await;
        assert_eq!(s, 200, "{v}");
        used += 1;
        let held = store.totals("api").await.get("k").copied().unwrap_or(0.0);
        if held > f64::from(used) {
            break;
        }
        assert!(used < 50, "no quota held ahead after {used} hits");
    }
    // the node's view of the window is synced (the held quota in it)
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let rest = 100 - used;
    for (cost, want) in [(rest, 200), (1, 429)] {
        let (dry, v) = hit(cost, true).await;
        let (real, w) = hit(cost, false).await;
        assert_eq!(
            (dry, real),
            (want, want),
            "cost {cost}: dry run {v}, hit {w}"
        );
    }
    let (s, _) = hit(rest, true).await;
    assert_eq!(s, 429, "at the limit");
    assert_eq!(
        store.totals("api").await.get("k").copied(),
        Some(100.0),
        "the limit, exactly"
    );
}
