//! Limits across the cluster: synchronous and strict admission at the door, nginx
//! `auth_request`, GCRA and resets, and the first touch of a key.

use super::*;

/// sync_rate 0: every answer includes every hit acknowledged before it was sent, on
/// any node.
pub(super) async fn synchronous(store: &Store) {
    let cluster = Cluster::start(3, &store.config(0.0), 0);
    let c = client();
    let acked = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let (c, lb, acked) = (c.clone(), cluster.lb.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                let before = acked.load(Ordering::SeqCst);
                let (status, n) = increment(&c, &lb, "api", "hot").await.expect("answered");
                assert_eq!(status, 200);
                assert!(
                    n.current + n.previous >= (before + 1) as f64,
                    "answer {n:?} misses hits acknowledged before it was sent ({before})"
                );
                acked.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    assert_eq!(store.totals("api").await.get("hot").copied(), Some(600.0));
}

/// sync_rate 0 with a limit: hits from many clients over 3 nodes never exceed the limit,
/// and denied hits leave no trace in the store.
pub(super) async fn synchronous_limit(store: &Store) {
    let config = store.config(0.0).replace(
        "store = \"main\"\n",
        "store = \"main\"\nlimits = [{ window_size = 3600, limit = 20 }]\n",
    );
    let cluster = Cluster::start(3, &config, 0);
    let allowed = hits_on_door(&cluster.lb, 8, 10).await;
    eprintln!("limit 20, 80 hits over 3 nodes: {allowed} allowed");
    assert!(
        allowed <= 20,
        "{allowed} hits allowed against a limit of 20"
    );
    assert!(allowed >= 1);
    assert_eq!(
        store.totals("api").await.get("door").copied(),
        Some(allowed as f64)
    );
}

/// Strict admission over three node processes: hits spread by the load balancer, at a
/// sync period far longer than the test, never pass the limit; after the nodes stop
/// (giving back what they hold) the store counts exactly the hits admitted.
pub(super) async fn strict_limit(store: &Store) {
    let config = store.config(5.0).replace(
        "store = \"main\"\n",
        "store = \"main\"\nlimits = [{ window_size = 3600, limit = 40 }]\nadmission = \"strict\"\n",
    );
    let mut cluster = Cluster::start(3, &config, 0);
    let allowed = hits_on_door(&cluster.lb, 8, 15).await;
    eprintln!("strict, limit 40, 120 hits over 3 nodes: {allowed} allowed");
    assert!(
        allowed <= 40,
        "{allowed} hits allowed against a limit of 40"
    );
    assert!(allowed >= 37, "only {allowed} of 40 allowed");
    for i in 0..3 {
        assert!(cluster.terminate(i), "node {i} stops cleanly");
    }
    assert_eq!(
        store.totals("api").await.get("door").copied(),
        Some(allowed as f64),
        "the store counts what was admitted, no quota left held"
    );
}

/// The shipped nginx snippet (config/nginx-auth-request.conf), run by a real nginx in
/// front of a backend: swin decides, nginx answers 429 with swin's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_limits_a_backend() {
    let _serial = SERIAL.lock().await;
    swin_testkit::cluster::use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let store = Store::sqlite().await;
    // the nodes want a token with the decide scope: the snippet's Authorization header,
    // with the operator's token put in
    let config = store.config(0.0).replace(
        "store = \"main\"\n",
        "store = \"main\"\nlimits = [{ window_size = 3600, limit = 3 }]\nkey_from = \"header:X-Api-Key\"\n",
    ) + &format!(
        "\n[[auth.tokens]]\nname = \"nginx\"\nsha256 = \"{}\"\nscopes = [\"decide\"]\n",
        swin_node::http::hash_token(b"nginx-secret")
    );
    let (front, back) = (swin_testkit::free_port(), swin_testkit::free_port());
    let snippet = include_str!("../../config/nginx-auth-request.conf");
    assert!(snippet.contains("Bearer REPLACE-WITH-A-DECIDE-TOKEN"));
    let snippet = snippet
        .replace("REPLACE-WITH-A-DECIDE-TOKEN", "nginx-secret")
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{front}"))
        .replace("127.0.0.1:9000", &format!("127.0.0.1:{back}"));
    assert!(snippet.contains(&format!("listen 127.0.0.1:{front};")));
    let extra = format!(
        "{snippet}\nserver {{ listen 127.0.0.1:{back}; location / {{ return 200 \"backend ok\\n\"; }} }}\n"
    );
    let _cluster = Cluster::start_with(2, &config, 0, &extra);
    swin_testkit::wait_for_port(front, Duration::from_secs(10));
    let c = client();
    let get = |key: Option<&str>| {
        let mut r = c.get(format!("http://127.0.0.1:{front}/orders/42"));
        if let Some(k) = key {
            r = r.header("X-Api-Key", k);
        }
        r.send()
    };
    for i in 0..3 {
        let r = get(Some("alice")).await.expect("request");
        assert_eq!(r.status().as_u16(), 200, "hit {i}");
        let state = r.headers().get("ratelimit").cloned();
        assert_eq!(r.text().await.expect("body"), "backend ok\n");
        let state = state.expect("RateLimit passed on");
        assert!(
            state
                .to_str()
                .expect("ascii")
                .starts_with(&format!("\"3600s\";r={};", 2 - i)),
            "{state:?}"
        );
    }
    let r = get(Some("alice")).await.expect("request");
    assert_eq!(r.status().as_u16(), 429);
    let retry: u64 = r
        .headers()
        .get("retry-after")
        .expect("Retry-After")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(retry >= 1);
    assert!(r.headers().get("ratelimit-policy").is_some());
    assert_eq!(
        get(Some("bob")).await.expect("request").status().as_u16(),
        200
    );
    // no key to limit by: swin's 401 goes through auth_request as it is
    assert_eq!(get(None).await.expect("request").status().as_u16(), 401);
    assert_eq!(store_count(&store, "alice").await, Some(3.0));
}

/// A GCRA namespace over 3 nodes: synchronous mode admits exactly the burst; periodic
/// mode converges on one bucket; DELETE resets a key on every node.
/// One scenario step by step (spend, sync, reset, spend again on every node); hence its length.
pub(super) async fn gcra_and_reset(store: &Store) {
    let config = format!(
        "store_timeout = 1\n\n{}\n\
         [[namespaces]]\nname = \"strict\"\nsync_rate = 0\nstore = \"main\"\nalgorithm = \"gcra\"\n\
         gcra = {{ burst = 10, count = 10, period = \"1h\" }}\n\n\
         [[namespaces]]\nname = \"loose\"\nsync_rate = 0.1\nstore = \"main\"\nalgorithm = \"gcra\"\n\
         gcra = {{ burst = 10, count = 10, period = \"1h\" }}\n",
        store.section()
    );
    let cluster = Cluster::start(3, &config, 0);
    let c = client();
    let hit = |ns: &str, base: &str, dry: bool| {
        let req = c
            .post(format!("{base}/v1/namespaces/{ns}/keys/k/hit"))
            .header("content-type", "application/json")
            .body(format!("{{\"dry_run\": {dry}}}"));
        async move {
            let r = req.send().await.expect("hit");
            let status = r.status().as_u16();
            let v: serde_json::Value = r.json().await.expect("json");
            (status, v)
        }
    };
    // synchronous: 8 clients × 5 hits through nginx, never more than the burst
    let allowed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (c, lb, allowed) = (c.clone(), cluster.lb.clone(), allowed.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let r = c
                    .post(format!("{lb}/v1/namespaces/strict/keys/k/hit"))
                    .send()
                    .await
                    .expect("hit");
                match r.status().as_u16() {
                    200 => {
                        allowed.fetch_add(1, Ordering::SeqCst);
                    }
                    429 => {}
                    other => panic!("hit answered {other}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let allowed = allowed.load(Ordering::SeqCst);
    eprintln!("gcra burst 10, 40 synchronous hits over 3 nodes: {allowed} allowed");
    assert!(allowed <= 10, "{allowed} admitted against a burst of 10");
    assert!(allowed >= 1);

    // periodic: 4 hits on each node, then every node sees the bucket empty
    // (a node that already sees others' spends may deny some: at least 10 pass)
    let mut passed = 0;
    for node in cluster.running() {
        for _ in 0..4 {
            let (status, v) = hit("loose", &node.base, false).await;
            assert!(status == 200 || status == 429, "{status} {v}");
            passed += usize::from(status == 200);
        }
    }
    assert!(passed >= 10, "{passed}");
    let bases: Vec<String> = cluster.running().map(|n| n.base.clone()).collect();
    let took = within(
        Duration::from_secs(3),
        "every node sees the cluster's spends",
        async || {
            for b in &bases {
                let (status, v) = hit("loose", b, true).await;
                if status != 429 || v["remaining"] != 0.0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    eprintln!("gcra periodic (0.1 s): every node empty after {took:?}");
    // every node's spends at the store first: a node's own spends can be in its view
    // (it saw the bucket empty) and not yet pushed, and a push landing after the reset
    // counts them after it, as any hit racing a reset may be (on a loaded machine the
    // 0.1 s sync can lag that long)
    for b in &bases {
        let r = c
            .post(format!("{b}/v1/namespaces/loose/sync"))
            .send()
            .await
            .expect("sync");
        assert_eq!(r.status().as_u16(), 200);
    }
    // a reset on one node reaches every node
    let r = c
        .delete(format!("{}/v1/namespaces/loose/keys/k", bases[0]))
        .send()
        .await
        .expect("delete");
    assert_eq!(r.status().as_u16(), 200);
    within(
        Duration::from_secs(3),
        "the reset reaches every node",
        async || {
            for b in &bases {
                let (status, v) = hit("loose", b, true).await;
                if status != 200 || v["remaining"] != 9.0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// First touch: node A counts keys that node B never saw, and pushes them; B's read,
/// dry run and first increment of them answer with the cluster's counts (they answered
/// with B's own zero: 0, a full quota, and 1).
pub(super) async fn first_touch(store: &Store) {
    let config = format!(
        "{}\n[[namespaces]]\nname = \"lim\"\nwindow_sizes = [3600]\nsync_rate = 0.1\n\
         store = \"main\"\nlimits = [{{ window_size = 3600, limit = 100 }}]\n",
        store.config(0.1)
    );
    let cluster = Cluster::start(2, &config, 0);
    let c = client();
    let (a, b) = (&cluster.nodes[0].base, &cluster.nodes[1].base);
    let hit = async |base: &str, key: &str, dry_run: bool| -> serde_json::Value {
        c.post(format!("{base}/v1/namespaces/lim/keys/{key}/hit"))
            .json(&serde_json::json!({ "dry_run": dry_run }))
            .send()
            .await
            .expect("hit")
            .json()
            .await
            .expect("json")
    };
    for _ in 0..10 {
        for key in ["read", "counted"] {
            assert_eq!(increment(&c, a, "api", key).await.expect("a").0, 200);
        }
        assert_eq!(hit(a, "decided", false).await["allowed"], true);
    }
    within(
        Duration::from_secs(10),
        "node A's hits in the store",
        async || {
            let (api, lim) = (store.totals("api").await, store.totals("lim").await);
            api.get("read") == Some(&10.0)
                && api.get("counted") == Some(&10.0)
                && lim.get("decided") == Some(&10.0)
        },
    )
    .await;
    assert_eq!(read(&c, b, "api", "read").await.current, 10.0, "B's read");
    let (status, counts) = increment(&c, b, "api", "counted").await.expect("b");
    assert_eq!((status, counts.current), (200, 11.0), "B's first increment");
    let on_a = hit(a, "decided", true).await;
    let on_b = hit(b, "decided", true).await;
    assert_eq!(on_b["remaining"], on_a["remaining"], "B's dry run: {on_b}");
    assert_eq!(
        hit(b, "decided", false).await["remaining"],
        on_a["remaining"]
    );
}
