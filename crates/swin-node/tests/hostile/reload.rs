//! A reload that points a store at something that does not answer (a closed Redis
//! port, a PostgreSQL database that does not exist) is refused: the node keeps counting
//! into the store it has, and every acknowledged hit is there after the stop. A reload
//! back to the limits the node started with applies them, as any other change does.

use std::time::Duration;

use swin_testkit::cluster::{within, TestStore};

use super::support::{increment, node};

fn config(section: &str) -> String {
    format!(
        "store_timeout = 1\nshutdown_grace = 3\n{section}\n[[namespaces]]\nname = \"api\"\nstore = \"main\"\nwindow_sizes = [3600]\nsync_rate = 0.1\n"
    )
}

async fn a_reload_to_a_store_that_does_not_answer_is_refused(store: TestStore, dead: String) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config(&store.section())).expect("write");
    let mut n = node(&path);
    let client = reqwest::Client::new();
    increment(&client, &n.base, "api", "k", 5).await;
    std::fs::write(&path, config(&dead)).expect("write");
    n.signal("HUP");
    // the refusal takes at most store_timeout; hits meanwhile count where they did
    tokio::time::sleep(Duration::from_millis(1500)).await;
    increment(&client, &n.base, "api", "k", 5).await;
    within(
        Duration::from_secs(10),
        "10 in the running store",
        async || store.totals("api").await.get("k") == Some(&10.0),
    )
    .await;
    let ready = client
        .get(format!("{}/readyz", n.base))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "still ready on the store it has");
    assert!(n.terminate());
    assert_eq!(store.totals("api").await.get("k"), Some(&10.0), "exact");
    assert!(
        std::fs::read_dir(dir.path().join("data"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "nothing spooled for a store that never answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_a_closed_redis_port_is_refused() {
    let store = TestStore::redis();
    let dead = format!(
        "[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\n",
        swin_testkit::free_port()
    );
    a_reload_to_a_store_that_does_not_answer_is_refused(store, dead).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_to_a_postgres_database_that_does_not_exist_is_refused() {
    let store = TestStore::postgres().await;
    let missing = super::support::missing_postgres_database();
    let dead = format!("[stores.main]\nkind = \"postgres\"\nurl = \"{missing}\"\n");
    a_reload_to_a_store_that_does_not_answer_is_refused(store, dead).await;
}

/// `/hit`s of `key` in the namespace `api` until one is denied (at most 20): how many
/// passed.
async fn admitted(client: &reqwest::Client, base: &str, key: &str) -> usize {
    for i in 0..20 {
        let r = client
            .post(format!("{base}/v1/namespaces/api/keys/{key}/hit"))
            .send()
            .await
            .expect("hit");
        if r.status() == 429 {
            return i;
        }
        assert_eq!(r.status(), 200);
    }
    20
}

/// Limits 5 → 3 → 5 by SIGHUP: each reload's limit is the one enforced, the last one
/// too (the node once kept 3, taking the file's 5 for the limits it started with).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_back_to_the_first_limits_applies_them() {
    let limited = |limit: u32| {
        format!(
            "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
             limits = [{{ window_size = 60, limit = {limit} }}]\n"
        )
    };
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, limited(5)).expect("write");
    let mut n = node(&path);
    let client = reqwest::Client::new();
    assert_eq!(admitted(&client, &n.base, "a").await, 5);
    for (round, limit) in [3, 5, 7, 5].into_iter().enumerate() {
        std::fs::write(&path, limited(limit)).expect("write");
        n.signal("HUP");
        let mut got = 0;
        for try_ in 0..50 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            // a fresh key per try: the reload has applied when one gets `limit`
            got = admitted(&client, &n.base, &format!("k{round}-{try_}")).await;
            if got == limit as usize {
                break;
            }
        }
        assert_eq!(got, limit as usize, "reload {round} to {limit}");
    }
    assert!(n.terminate());
}
