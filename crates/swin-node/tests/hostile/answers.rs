//! Answers a client may rely on, as a hostile client probes them: a cost is checked
//! against the key's *effective* limits (its runtime limits too, never a limit in
//! shadow); a limit below 1 denies a hit, it does not refuse it; a runtime limit that
//! would change nothing is refused; a lease or reservation shorter than the store's
//! millisecond is refused; the status page forbids scripts it did not ship. Each case
//! asserts the exact counts the store holds afterwards.

use std::time::Duration;

use serde_json::{json, Value};
use swin_testkit::cluster::{within, TestStore};

use super::support::{call, node_in as node, post};

/// What the store holds for `key` in `namespace` once the node has pushed it: waits
/// until the total is `want` (failing on more) and answers it.
async fn stored(store: &TestStore, namespace: &str, key: &str, window: u32, want: f64) {
    let mut last = 0.0;
    within(
        Duration::from_secs(15),
        "the store holds the hits",
        async || {
            last = store
                .totals_in(namespace, Some(window))
                .await
                .get(key)
                .copied()
                .unwrap_or(0.0);
            assert!(
                last <= want,
                "{namespace}/{key}: {last} stored, more than {want}"
            );
            last == want
        },
    )
    .await;
}

fn config(store: &TestStore) -> String {
    format!(
        "{}
[[namespaces]]
name = \"api\"
window_sizes = [60, 3600]
sync_rate = 0.1
store = \"main\"
limits = [{{ window_size = 60, limit = 10 }}]

[[namespaces]]
name = \"bucket\"
sync_rate = 0.1
store = \"main\"
algorithm = \"gcra\"
gcra = {{ burst = 10, count = 10, period = \"1m\" }}

[[namespaces]]
name = \"mixed\"
window_sizes = [60, 3600]
sync_rate = 0.1
store = \"main\"
limits = [{{ window_size = 3600, limit = 10000 }}, {{ window_size = 60, limit = 1000, shadow = true }}]

[[namespaces]]
name = \"shadowed\"
window_sizes = [60]
sync_rate = 0.1
store = \"main\"
shadow = true
limits = [{{ window_size = 60, limit = 10 }}]

[[namespaces]]
name = \"tiny\"
window_sizes = [60]
sync_rate = 0.1
store = \"main\"
limits = [{{ window_size = 60, limit = 0.5 }}]

[[namespaces]]
name = \"envoy\"
sync_rate = 0.1
store = \"main\"
[[namespaces.descriptors]]
key = \"user\"
rate_limit = {{ unit = \"minute\", requests_per_unit = 5 }}
[[namespaces.descriptors]]
key = \"free\"
rate_limit = {{ unlimited = true }}
[[namespaces.descriptors]]
key = \"banned\"
rate_limit = {{ unit = \"minute\", requests_per_unit = 0 }}

[[namespaces]]
name = \"slots\"
store = \"main\"
sync_rate = 0.1
algorithm = \"concurrency\"
limit = 3
",
        store.section()
    )
}

/// Costs are checked against the key's effective limits, after its runtime limits are
/// read (a key raised to 1,000,000 could not spend 20,000: 400 "from 0 to 10"), and
/// limits in shadow refuse no cost (a hit above one was a 400, even in a namespace in
/// shadow); a commit's overrun is charged up to what the enforced limits leave (a
/// shadow limit capped it: 900 of 4,900 charged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn costs_are_checked_against_the_keys_effective_enforced_limits() {
    let dir = tempfile::tempdir().expect("dir");
    let store = TestStore::redis();
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let base = &n.base;
    let put = |ns: &str, key: &str, body: Value| {
        call(
            &c,
            reqwest::Method::PUT,
            format!("{base}/v1/namespaces/{ns}/keys/{key}/limits"),
            body,
        )
    };
    let hit = |ns: &str, key: &str, cost: f64| {
        post(
            &c,
            format!("{base}/v1/namespaces/{ns}/keys/{key}/hit"),
            json!({ "cost": cost }),
        )
    };

    // a key raised at run time spends what its own limit takes, on every door of hits
    let (s, v) = put(
        "api",
        "big",
        json!({"limits": [{"window_size": 60, "limit": 1_000_000}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = hit("api", "big", 20_000.0).await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(
        &c,
        format!("{base}/v1/hits"),
        json!({"hits": [{"namespace": "api", "key": "big", "cost": 30_000}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = post(
        &c,
        format!("{base}/v1/namespaces/api/keys/big/reserve"),
        json!({"cost": 40_000}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    // the config's limit still holds a key without one: 11 is more than 10 at once
    let (s, v) = hit("api", "plain", 11.0).await;
    assert_eq!(s, 400, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("from 0 to 10,") || message.contains("from 0 to 10"),
        "{v}"
    );
    // a GCRA key raised to burst 1,000 spends 50
    let (s, v) = put(
        "bucket",
        "big",
        json!({"gcra": {"burst": 1000, "count": 1000, "period": "1m"}}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let (s, v) = hit("bucket", "big", 50.0).await;
    assert_eq!(s, 200, "{v}");

    // a hit above a limit in shadow is decided (and marked), not refused
    let (s, v) = hit("mixed", "k", 2_000.0).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["shadow_denied"], true, "{v}");
    let (s, v) = hit("shadowed", "k", 50.0).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["shadow_denied"], true, "{v}");

    // reserve 100, commit 5,000 beside a shadow limit of 1,000: the enforced limit
    // (10,000 an hour, 2,000 spent) takes the whole overrun
    let (s, v) = post(
        &c,
        format!("{base}/v1/namespaces/mixed/keys/k/reserve"),
        json!({"cost": 100}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let id = v["reservation"].as_str().expect("an id").to_owned();
    let (s, v) = post(
        &c,
        format!("{base}/v1/namespaces/mixed/keys/k/commit"),
        json!({"reservation": id, "cost": 5_000}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (v["charged"].as_f64(), v["uncharged"].as_f64()),
        (Some(4_900.0), Some(0.0)),
        "{v}"
    );

    // exactly what was let through reached the store
    stored(&store, "api", "big", 60, 90_000.0).await;
    stored(&store, "mixed", "k", 3600, 7_000.0).await;
    stored(&store, "shadowed", "k", 60, 50.0).await;
    assert_eq!(store.totals("api").await.get("plain"), None);
}

/// A limit below 1 denies a hit of 1 (429), as any limit a hit is over; it was a 400
/// for every hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_below_one_denies_and_counts_nothing() {
    let dir = tempfile::tempdir().expect("dir");
    let store = TestStore::redis();
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let base = &n.base;
    for _ in 0..3 {
        let r = c
            .post(format!("{base}/v1/namespaces/tiny/keys/k/hit"))
            .send()
            .await
            .expect("hit");
        assert_eq!(r.status(), 429);
    }
    // a runtime limit below 1 on a key of another namespace: the same
    let (s, v) = call(
        &c,
        reqwest::Method::PUT,
        format!("{base}/v1/namespaces/api/keys/low/limits"),
        json!({"limits": [{"window_size": 60, "limit": 0.25}]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let r = c
        .post(format!("{base}/v1/namespaces/api/keys/low/hit"))
        .send()
        .await
        .expect("hit");
    assert_eq!(r.status(), 429);
    // another key is untouched, and nothing denied was counted
    increment_and_wait(&c, base, &store).await;
    let totals = store.totals("tiny").await;
    assert_eq!(totals.get("k"), None, "{totals:?}");
    assert_eq!(store.totals("api").await.get("low"), None);
}

/// One acknowledged hit on `api/other`, seen in the store: the node has pushed since.
async fn increment_and_wait(c: &reqwest::Client, base: &str, store: &TestStore) {
    let r = c
        .post(format!("{base}/v1/namespaces/api/keys/other/hit"))
        .send()
        .await
        .expect("hit");
    assert_eq!(r.status(), 200);
    stored(store, "api", "other", 60, 1.0).await;
}

/// A runtime limit on an Envoy counter key whose rule is unlimited, blocks, or does not
/// exist would change nothing: 400 naming why (it was 200 `source: override`), and no
/// limit is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_limits_that_would_change_nothing_are_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let store = TestStore::redis();
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let base = &n.base;
    let body = json!({"limits": [{"window_size": 60, "limit": 1}]});
    for (key, why) in [
        ("free=x", "unlimited"),
        ("banned=x", "blocks every request"),
        ("nobody=x", "matches no descriptor rule"),
        ("not-a-counter-key", "no descriptor's counter key"),
    ] {
        let (s, v) = call(
            &c,
            reqwest::Method::PUT,
            format!("{base}/v1/namespaces/envoy/keys/{key}/limits"),
            body.clone(),
        )
        .await;
        assert_eq!(s, 400, "{key}: {v}");
        let message = v["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(why), "{key}: {v}");
    }
    let (s, v) = call(
        &c,
        reqwest::Method::PUT,
        format!("{base}/v1/namespaces/envoy/keys/user=alice/limits"),
        body,
    )
    .await;
    assert_eq!(s, 200, "a key its rule counts: {v}");
    let (s, v) = call(
        &c,
        reqwest::Method::GET,
        format!("{base}/v1/namespaces/envoy/limits"),
        Value::Null,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let keys: Vec<&str> = v["limits"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|l| l["key"].as_str())
        .collect();
    assert_eq!(keys, vec!["user=alice"], "{v}");
}

/// A lease or reservation shorter than a millisecond would lapse before it is granted:
/// 400 (it was granted, already lapsed), and nothing is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_under_a_millisecond_is_refused() {
    let dir = tempfile::tempdir().expect("dir");
    let store = TestStore::redis();
    let n = node(dir.path(), &config(&store));
    let c = reqwest::Client::new();
    let base = &n.base;
    for ttl in [0.0001, 0.0009] {
        let (s, v) = post(
            &c,
            format!("{base}/v1/namespaces/slots/keys/k/acquire"),
            json!({"ttl": ttl}),
        )
        .await;
        assert_eq!(s, 400, "{ttl}: {v}");
        let (s, v) = post(
            &c,
            format!("{base}/v1/namespaces/api/keys/k/reserve"),
            json!({"cost": 1, "ttl": ttl}),
        )
        .await;
        assert_eq!(s, 400, "{ttl}: {v}");
    }
    // a millisecond is the shortest: granted
    let (s, v) = post(
        &c,
        format!("{base}/v1/namespaces/api/keys/k/reserve"),
        json!({"cost": 1, "ttl": 0.001}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    // three slots are free: nothing was taken by the refused acquires
    for _ in 0..3 {
        let (s, v) = post(
            &c,
            format!("{base}/v1/namespaces/slots/keys/k/acquire"),
            json!({}),
        )
        .await;
        assert_eq!((s, v["allowed"].as_bool()), (200, Some(true)), "{v}");
    }
    stored(&store, "api", "k", 60, 1.0).await;
}

/// The status page sends headers that keep a script it did not ship from running and
/// keep it out of frames.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_forbids_foreign_scripts_and_frames() {
    let dir = tempfile::tempdir().expect("dir");
    let n = node(
        dir.path(),
        "[[namespaces]]\nname = \"api\"\nwindow_sizes = [60]\nsync_rate = -1\n",
    );
    let r = reqwest::get(format!("{}/ui", n.base)).await.expect("ui");
    assert_eq!(r.status(), 200);
    let h = |name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().expect("ascii").to_owned())
            .unwrap_or_default()
    };
    let csp = h("content-security-policy");
    for part in [
        "default-src 'none'",
        "script-src 'sha256-",
        "frame-ancestors 'none'",
        "connect-src 'self'",
    ] {
        assert!(csp.contains(part), "{part} in {csp:?}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(h("x-frame-options"), "DENY");
    assert_eq!(h("x-content-type-options"), "nosniff");
}
