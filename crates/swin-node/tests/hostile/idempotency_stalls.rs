//! Idempotency claims through a store that stalls (a Redis stopped with SIGSTOP): the
//! request is answered 503 and runs nothing, and the claim the store takes once it wakes
//! is released as soon as it answers, so a retry with the same key after the store is
//! back runs at once (not 409 `idempotency_in_progress` until the claim's 30 s hold
//! lapses), counted exactly once, and its answer is kept for the retries after it. Both
//! ways a claim lands late: its call still running when the store wakes (the node hears
//! the store's answer), and its call cut short by `store_timeout` first (the node cannot
//! tell whether it landed, and releases once a sync reaches the store again).

use std::time::{Duration, Instant};

use swin_testkit::cluster::{within, TestStore};

use super::support::OwnRedis;

/// One synchronous namespace, `a`, with a limit far above what the test sends.
fn config(store: &TestStore, store_timeout: f64) -> String {
    format!(
        "store_timeout = {store_timeout}\nanswer_timeout = 0.5\n{}\n\
         [[namespaces]]\nname = \"a\"\nwindow_sizes = [86400]\nsync_rate = 0\nstore = \"main\"\n\
         limits = [{{ window_size = 86400, limit = 1000 }}]\n",
        store.section()
    )
}

/// A hit of `cost` on `a`'s key `k` under `key` (none: no header): the status, whether it
/// was replayed, and the body.
async fn hit(c: &reqwest::Client, base: &str, key: Option<&str>, cost: u32) -> (u16, bool, String) {
    let mut r = c
        .post(format!("{base}/v1/namespaces/a/keys/k/hit"))
        .json(&serde_json::json!({ "cost": cost }));
    if let Some(key) = key {
        r = r.header("idempotency-key", key);
    }
    let r = r.send().await.expect("send");
    let status = r.status().as_u16();
    let replayed = r.headers().get("idempotent-replayed").is_some();
    (status, replayed, r.text().await.expect("body"))
}

/// The store stalls while a request claims its key: 503 within `answer_timeout`, nothing
/// counted. `stall` later the store wakes, takes the claim, and the node releases it.
/// Answers how long after the store woke a retry first ran (every retry before it got
/// 409), and checks that it ran once: 200, counted once, answered again after.
async fn stalled_claim_then_retry(store_timeout: f64, stall: Duration) -> Duration {
    let own = OwnRedis::start(|s| config(s, store_timeout));
    let (c, base) = (reqwest::Client::new(), own.node.base.clone());
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{}", own.port), "hostile");
    assert_eq!(hit(&c, &base, None, 1).await.0, 200, "the store is reached");

    own.server().signal("STOP");
    let t = Instant::now();
    let (status, _, body) = hit(&c, &base, Some("stalled-1"), 3).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("store_unreachable"), "{body}");
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    tokio::time::sleep(stall.saturating_sub(t.elapsed())).await;
    own.server().signal("CONT");
    let woke = Instant::now();

    // retried until it runs: at once, or after a few 409s, far inside the claim's hold
    let first = loop {
        let (status, replayed, body) = hit(&c, &base, Some("stalled-1"), 3).await;
        match status {
            409 => assert!(body.contains("idempotency_in_progress"), "{body}"),
            _ => {
                assert_eq!((status, replayed), (200, false), "{body}");
                break body;
            }
        }
        assert!(
            woke.elapsed() < Duration::from_secs(10),
            "still in flight {:?} after the store woke: the claim was not released",
            woke.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ran_after = woke.elapsed();
    let (status, replayed, again) = hit(&c, &base, Some("stalled-1"), 3).await;
    assert!(
        status == 200 && replayed && again == first,
        "{status} {again}"
    );

    // the hit before the stall and the retry's, each once; and it stays so
    within(
        Duration::from_secs(20),
        "the store counts 1 + 3",
        async || store.totals("a").await.get("k").copied() == Some(4.0),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(store.totals("a").await.get("k").copied(), Some(4.0));
    ran_after
}

/// The claim's call is still running when the store wakes (2 s stall, `store_timeout`
/// 5 s): the node hears it land and releases it at once; the first retry runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_answered_after_its_503_is_released_and_the_retry_runs_at_once() {
    let ran_after = stalled_claim_then_retry(5.0, Duration::from_secs(2)).await;
    assert!(ran_after < Duration::from_secs(2), "{ran_after:?}");
}

/// The claim's call is cut short by `store_timeout` (1 s) before the store wakes (3 s
/// stall): whether it landed is unknown, so the node releases it once a sync reaches the
/// store again; a retry runs within seconds, not after the claim's 30 s hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_cut_short_by_the_store_timeout_is_released_once_the_store_is_back() {
    let ran_after = stalled_claim_then_retry(1.0, Duration::from_secs(3)).await;
    assert!(ran_after < Duration::from_secs(10), "{ran_after:?}");
}
