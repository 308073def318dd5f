//! Runtime limits when things go wrong: a store that goes away refuses changes (503,
//! nothing changed) while decisions go on under what the node holds, exactly; limits an
//! operator wrote by hand that the namespace cannot hold are ignored, not obeyed and
//! not a 500; two nodes changing one key at once end up agreeing with the store.

use std::time::Duration;

use swin_testkit::cluster::{within, TestStore};

use super::support::node;

/// `n` hits of `key` on `base`: the statuses, in order.
async fn hits(c: &reqwest::Client, base: &str, ns: &str, key: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let r = c
            .post(format!("{base}/v1/namespaces/{ns}/keys/{key}/hit"))
            .send()
            .await
            .expect("hit");
        out.push(r.status().as_u16());
    }
    out
}

fn allowed_then_denied(allowed: usize, denied: usize) -> Vec<u16> {
    let mut v = vec![200; allowed];
    v.extend(vec![429; denied]);
    v
}

async fn send(
    c: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let mut req = c.request(method, url);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

fn limit(n: u32) -> Option<serde_json::Value> {
    Some(serde_json::json!({"limits": [{"window_size": 3600, "limit": n}]}))
}

const NAMESPACE: &str = "
[[namespaces]]
name = \"api\"
window_sizes = [3600]
sync_rate = 0.2
store = \"main\"
limits = [{ window_size = 3600, limit = 5 }]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_refuses_changes_and_decisions_go_on_exactly() {
    let dir = tempfile::tempdir().expect("dir");
    let port = swin_testkit::free_port();
    let mut server = Some(swin_testkit::start_redis(port, dir.path()));
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{port}"), "hostile");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!("store_timeout = 1\n{}{NAMESPACE}", store.section()),
    )
    .expect("config");
    let n = node(&path);
    let c = reqwest::Client::new();
    let base = &n.base;
    let key_limits = |k: &str| format!("{base}/v1/namespaces/api/keys/{k}/limits");
    assert_eq!(
        send(&c, reqwest::Method::PUT, key_limits("k1"), limit(2))
            .await
            .0,
        200
    );
    assert_eq!(
        hits(&c, base, "api", "k1", 3).await,
        allowed_then_denied(2, 1)
    );

    drop(server.take()); // the store goes away
    let (s, v) = send(&c, reqwest::Method::PUT, key_limits("k2"), limit(1)).await;
    assert_eq!(s, 503, "{v}");
    // the first change may find the node's connection broken under it (the store went
    // away as it was sent): whether the store took it, the node cannot tell
    let code = v["error"]["code"].as_str();
    assert!(
        matches!(code, Some("store_unreachable" | "outcome_unknown")),
        "{v}"
    );
    let (s, v) = send(&c, reqwest::Method::DELETE, key_limits("k1"), None).await;
    assert_eq!(s, 503, "{v}");
    let (s, _) = send(&c, reqwest::Method::GET, key_limits("k1"), None).await;
    assert_eq!(s, 503);
    let (s, _) = send(
        &c,
        reqwest::Method::GET,
        format!("{base}/v1/namespaces/api/limits"),
        None,
    )
    .await;
    assert_eq!(s, 503);
    // decisions go on: k1 keeps its runtime limit (the delete did nothing), k2 and a new
    // key are decided under the config's 5, exactly
    assert_eq!(
        hits(&c, base, "api", "k1", 1).await,
        allowed_then_denied(0, 1)
    );
    assert_eq!(
        hits(&c, base, "api", "k2", 6).await,
        allowed_then_denied(5, 1)
    );
    assert_eq!(
        hits(&c, base, "api", "k3", 6).await,
        allowed_then_denied(5, 1)
    );

    server = Some(swin_testkit::start_redis(port, dir.path()));
    within(
        Duration::from_secs(15),
        "changes go through again",
        async || {
            send(&c, reqwest::Method::PUT, key_limits("k4"), limit(1))
                .await
                .0
                == 200
        },
    )
    .await;
    // until a sync has reached the store again the namespace answers from what the node
    // knows, and a key whose limits changed meanwhile is decided under the config's
    within(
        Duration::from_secs(15),
        "the namespace syncs again",
        async || {
            let (_, v) = send(
                &c,
                reqwest::Method::GET,
                format!("{base}/v1/namespaces"),
                None,
            )
            .await;
            v["namespaces"][0]["degraded"] == false
        },
    )
    .await;
    assert_eq!(
        hits(&c, base, "api", "k4", 2).await,
        allowed_then_denied(1, 1)
    );
    let (_, v) = send(&c, reqwest::Method::GET, key_limits("k1"), None).await;
    assert_eq!(
        (&v["source"], &v["limits"][0]["limit"]),
        (&"override".into(), &2.0.into()),
        "{v}"
    );
    let (_, v) = send(&c, reqwest::Method::GET, key_limits("k2"), None).await;
    assert_eq!(v["source"], "config", "the refused PUT left nothing: {v}");
    drop(n);
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_written_by_hand_that_the_namespace_cannot_hold_are_ignored() {
    let store = TestStore::sqlite().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!("store_timeout = 1\n{}{NAMESPACE}", store.section()),
    )
    .expect("config");
    let swin_sync::Store::Sqlite(sqlite) = &store.store else {
        panic!("sqlite")
    };
    // an operator's rows: a window size the namespace lacks, JSON that is no limit, and
    // text that is not JSON
    for (key, limits) in [
        ("odd-size", r#"{"limits":[{"window_size":7,"limit":1}]}"#),
        ("not-a-limit", r#"{"colour":"red"}"#),
        ("not-json", "{{{"),
    ] {
        sqlx::query(
            "INSERT INTO swin_key_limits (namespace, key, limits, set_by, set_at)
             VALUES ('api', ?1, ?2, 'hand', 0)",
        )
        .bind(key)
        .bind(limits)
        .execute(sqlite.pool())
        .await
        .expect("insert");
    }
    let n = node(&path);
    let c = reqwest::Client::new();
    for key in ["odd-size", "not-a-limit", "not-json"] {
        assert_eq!(
            hits(&c, &n.base, "api", key, 6).await,
            allowed_then_denied(5, 1),
            "{key}"
        );
        let (s, v) = send(
            &c,
            reqwest::Method::GET,
            format!("{}/v1/namespaces/api/keys/{key}/limits", n.base),
            None,
        )
        .await;
        assert_eq!(s, 200, "{key}: {v}");
        assert_eq!(v["source"], "config", "{key}: {v}");
        assert!(v["ignored"].is_string(), "{key}: {v}");
    }
    let (s, page) = send(
        &c,
        reqwest::Method::GET,
        format!("{}/v1/namespaces/api/limits", n.base),
        None,
    )
    .await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page["limits"].as_array().expect("list").len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_changing_one_key_at_once_agree_with_the_store() {
    let store = TestStore::postgres().await;
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        // the changes queue on the key's row: a second each left too little on a loaded
        // machine (the suite runs two tests at once, some with several nodes), and 3 s
        // once with a release build beside it
        format!("store_timeout = 10\n{}{NAMESPACE}", store.section()),
    )
    .expect("config");
    let (a, b) = (node(&path), node(&path));
    let c = reqwest::Client::new();
    // both serve the key before the storm
    for base in [&a.base, &b.base] {
        assert_eq!(hits(&c, base, "api", "t", 1).await, vec![200]);
    }
    let mut storm = Vec::new();
    for i in 0..60u32 {
        let base = if i % 2 == 0 {
            a.base.clone()
        } else {
            b.base.clone()
        };
        let c = c.clone();
        storm.push(tokio::spawn(async move {
            let url = format!("{base}/v1/namespaces/api/keys/t/limits");
            let (s, v) = if i % 7 == 3 {
                send(&c, reqwest::Method::DELETE, url, None).await
            } else {
                send(&c, reqwest::Method::PUT, url, limit(100 + i)).await
            };
            // the changes queue on the namespace's change row; on a starved machine one
            // may outwait the store timeout, and then it must say so: nothing changed,
            // or (applied in time, its reply late) unknown; what follows checks that
            // the nodes agree with the store
            let code = v["error"]["code"].as_str();
            assert!(
                s == 200
                    || (s == 503 && matches!(code, Some("store_unreachable" | "outcome_unknown"))),
                "{s} {v}"
            );
            s == 200
        }));
    }
    let mut applied = 0;
    for t in storm {
        applied += u32::from(t.await.expect("change"));
    }
    assert!(applied > 0, "no change was applied");
    let (_, v) = send(
        &c,
        reqwest::Method::GET,
        format!("{}/v1/namespaces/api/keys/t/limits", a.base),
        None,
    )
    .await;
    let want = v["limits"][0]["limit"].as_f64().expect("limit");
    let dry = async |base: &str| {
        let (_, v) = send(
            &c,
            reqwest::Method::POST,
            format!("{base}/v1/namespaces/api/keys/t/hit"),
            Some(serde_json::json!({"dry_run": true})),
        )
        .await;
        v["limit"].as_f64().expect("limit")
    };
    within(
        Duration::from_secs(15),
        "both nodes hold the store's last",
        async || dry(&a.base).await == want && dry(&b.base).await == want,
    )
    .await;
}

/// A runtime limit lowered on a strict namespace holds at once on the node that took the
/// call, even over the quota that node holds from the store under the old limit (a key
/// at 20 of 100, lowered to 10: 81 more were admitted), and on another node as soon as it
/// reads the change (two sync periods); the store ends with exactly the hits admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_on_a_strict_namespace_holds_over_quota_already_held() {
    let store = TestStore::redis();
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!(
            "{}
[[namespaces]]
name = \"api\"
window_sizes = [3600]
sync_rate = 0.1
store = \"main\"
admission = \"strict\"
limits = [{{ window_size = 3600, limit = 100 }}]
",
            store.section()
        ),
    )
    .expect("config");
    let (a, b) = (node(&path), node(&path));
    let c = reqwest::Client::new();
    // both nodes hold quota for the key: 20 admitted on a, 5 on b
    assert_eq!(hits(&c, &a.base, "api", "k", 20).await, vec![200; 20]);
    assert_eq!(hits(&c, &b.base, "api", "k", 5).await, vec![200; 5]);
    let (s, v) = send(
        &c,
        reqwest::Method::PUT,
        format!("{}/v1/namespaces/api/keys/k/limits", a.base),
        limit(10),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    // at once on a, whatever it holds
    assert_eq!(hits(&c, &a.base, "api", "k", 10).await, vec![429; 10]);
    // b reads the change within two sync periods; give it a second
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(hits(&c, &b.base, "api", "k", 10).await, vec![429; 10]);
    // the unused quota goes back once the key idles: the store holds the 25 admitted
    let mut total = 0.0;
    within(
        Duration::from_secs(20),
        "the store holds what was admitted",
        async || {
            total = store.totals("api").await.get("k").copied().unwrap_or(0.0);
            total == 25.0
        },
    )
    .await;
    // raised again, exactly the room under it is admitted, across both nodes
    let (s, v) = send(
        &c,
        reqwest::Method::PUT,
        format!("{}/v1/namespaces/api/keys/k/limits", b.base),
        limit(30),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut admitted = 0;
    for n in [&a, &b, &a, &b, &a, &b] {
        admitted += hits(&c, &n.base, "api", "k", 2)
            .await
            .iter()
            .filter(|s| **s == 200)
            .count();
    }
    assert_eq!(admitted, 5, "30 − 25");
}

/// A runtime limit changed while the store hangs (SIGSTOP) is refused within a second
/// (503, nothing changed) and stays refused once the store wakes up: the store applies a
/// change only within its deadline (it landed when the store came back, and every node
/// then enforced it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_refused_while_the_store_hangs_never_lands() {
    let own = super::support::OwnRedis::start(|store| {
        format!("store_timeout = 1\n{}{NAMESPACE}", store.section())
    });
    let c = reqwest::Client::new();
    let base = own.node.base.clone();
    let key_limits = |k: &str| format!("{base}/v1/namespaces/api/keys/{k}/limits");
    let (s, v) = send(&c, reqwest::Method::PUT, key_limits("kept"), limit(2)).await;
    assert_eq!(s, 200, "{v}");

    own.server().signal("STOP");
    // each answered within its store_timeout (1 s here)
    let t = std::time::Instant::now();
    let (s, v) = send(&c, reqwest::Method::PUT, key_limits("k"), limit(1)).await;
    assert_eq!(s, 503, "{v}");
    let put_in = t.elapsed();
    let t = std::time::Instant::now();
    let (s, v) = send(&c, reqwest::Method::DELETE, key_limits("kept"), None).await;
    assert_eq!(s, 503, "{v}");
    let delete_in = t.elapsed();
    own.server().signal("CONT");

    // once the store answers again, what was refused has not happened: k is under the
    // config's 5, kept under its runtime 2, on this node and on a node started now
    tokio::time::sleep(Duration::from_secs(1)).await;
    let other = node(&own.dir.path().join("swin.toml"));
    for n in [&own.node.base, &other.base] {
        let (s, v) = send(
            &c,
            reqwest::Method::GET,
            format!("{n}/v1/namespaces/api/keys/k/limits"),
            None,
        )
        .await;
        assert_eq!((s, v["source"].as_str()), (200, Some("config")), "{v}");
        let (s, v) = send(
            &c,
            reqwest::Method::GET,
            format!("{n}/v1/namespaces/api/keys/kept/limits"),
            None,
        )
        .await;
        assert_eq!((s, v["source"].as_str()), (200, Some("override")), "{v}");
    }
    assert_eq!(
        hits(&c, &other.base, "api", "k", 6).await,
        allowed_then_denied(5, 1)
    );
    assert_eq!(
        hits(&c, &other.base, "api", "kept", 3).await,
        allowed_then_denied(2, 1)
    );
    for took in [put_in, delete_in] {
        assert!(took < Duration::from_millis(1500), "{took:?}");
    }
}
