//! The library's example, run as a test: two limiters in one process share one limit,
//! on a SQLite file and on Redis (under a key prefix of the test's own, removed after).

#[allow(dead_code)] // the example's `main`
#[path = "../examples/embedded.rs"]
mod embedded;

use embedded::{share_a_limit, Shared};

const EXACT: Shared = Shared {
    allowed: [6, 4],
    next: [false, false],
    other_key: true,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_share_a_limit_on_sqlite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!(
        "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite://{}\"",
        dir.path().join("counts.db").display()
    );
    let shared = share_a_limit(dir.path(), &store).await.expect("ran");
    assert_eq!(shared, EXACT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_share_a_limit_on_redis() {
    let url = swin_testkit::redis_url();
    let prefix = format!(
        "swin-embedded-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let store = format!("[stores.main]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"");
    let shared = share_a_limit(dir.path(), &store).await;
    // the test's keys go, whatever it found
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}*"))
        .query_async(&mut c)
        .await
        .expect("keys");
    if !keys.is_empty() {
        let _: () = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut c)
            .await
            .expect("del");
    }
    assert_eq!(shared.expect("ran"), EXACT);
    assert!(!keys.is_empty(), "the limiters counted in the Redis given");
}
