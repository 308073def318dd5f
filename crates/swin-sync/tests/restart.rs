//! Stops and restarts a real ephemeral server under a running engine — Debian's Redis,
//! Valkey 9, Redis 8 and PostgreSQL: diffs made while the store is down land exactly
//! once when it is back (on the Redis-protocol servers, with the scripts they lost).

use std::sync::Arc;
use std::time::Duration;

use swin_core::{CounterOptions, NamespaceCounters, UnixMs, WindowSize};
use swin_sync::store::{PostgresStore, RedisStore};
use swin_sync::{NamespaceSync, Store, SyncMode, WindowKey};
use swin_testkit::{wait_until, EphemeralPostgres, RedisServer};

/// Runs an engine against `store`, stops the server under it with `stop`, keeps
/// counting, restarts it with `start` and checks that the store holds every hit once.
async fn restart_mid_run(store: Store, stop: impl FnOnce(), start: impl FnOnce()) {
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &[WindowSize::new(3600).expect("size")],
        CounterOptions::default(),
    ));
    let engine = Arc::new(NamespaceSync::new(
        counters,
        SyncMode::Periodic(Duration::from_millis(50)),
        Some(store.clone()),
        "n1".into(),
        Duration::from_secs(1),
    ));
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(engine.clone().run(cancel.clone()));
    let now = || UnixMs::from_system_time(std::time::SystemTime::now());
    let first = WindowSize::new(3600).expect("size").start_of(now());

    for _ in 0..100 {
        engine.increment("k", 3600, 1.0, now()).await.expect("inc");
    }
    wait_until(Duration::from_secs(30), "first pushes", || {
        engine.status().syncs >= 2 && engine.status().pending_diffs == 0
    })
    .await;
    stop();
    for _ in 0..50 {
        engine
            .increment("k", 3600, 1.0, now())
            .await
            .expect("answered while the store is down");
    }
    wait_until(Duration::from_secs(30), "degraded", || {
        engine.status().degraded.is_some()
    })
    .await;
    start();
    wait_until(Duration::from_secs(60), "recovered", || {
        engine.status().degraded.is_none() && engine.status().pending_diffs == 0
    })
    .await;
    cancel.cancel();
    task.await.expect("engine");
    // if the hour turned during the test, the hits are split over two windows
    let windows = [first, first + 3600].map(|s| WindowKey {
        key: "k".into(),
        window_size: 3600,
        window_start: s,
    });
    let got = store.read("api", &windows).await.expect("read");
    assert_eq!(got.iter().map(|t| t.count).sum::<f64>(), 150.0);
}

/// A server of the test's own from `server`'s binary, killed and started again (on the
/// same port, from its append-only file) under a running engine.
async fn redis_restart(server: RedisServer) {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = swin_testkit::free_port();
    let running = std::cell::RefCell::new(Some(server.start(port, dir.path())));
    let url = format!("redis://127.0.0.1:{port}");
    server.check(&url).await;
    let store = Store::Redis(RedisStore::new(&url, "swin").expect("connect"));
    restart_mid_run(
        store,
        || running.borrow_mut().take().expect("running").kill(),
        || *running.borrow_mut() = Some(server.start(port, dir.path())),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run_loses_and_doubles_nothing() {
    redis_restart(RedisServer::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_restart_mid_run_loses_and_doubles_nothing() {
    redis_restart(RedisServer::Valkey).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis8_restart_mid_run_loses_and_doubles_nothing() {
    redis_restart(RedisServer::Redis8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_mid_run_loses_and_doubles_nothing() {
    let pg = EphemeralPostgres::init();
    pg.start();
    let store = Store::Postgres(PostgresStore::new(&pg.url(), 4).expect("pool"));
    store.migrate().await.expect("migrate");
    restart_mid_run(store, || pg.stop(), || pg.start()).await;
}
