//! A limiter's life: a reconfigure that changes limits keeps the counts and decides the
//! next hit under the new ones, adds and retires namespaces; a stop pushes what a
//! periodic namespace counted, so a fresh limiter reads it back.

use swin::config::Config;
use swin::error::Error;
use swin::limiter::LimiterErrorKind;
use swin::Limiter;
use swin_testkit::TestStore;

use super::{config_on, document, hourly, known, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_reconfigure_applies_new_limits_and_keeps_the_counts,
    a_stop_pushes_what_a_periodic_namespace_counted,
    a_reconfigure_keeps_the_running_data_dir,
    a_rebuilt_namespace_pushes_while_the_one_it_replaced_waits_to_retire,
    a_reconfigure_or_stop_dropped_midway_still_finishes,
]);

/// `sync` decided on the store's count, `periodic` synced every hour, each of `limit`.
fn both(limit: u32) -> String {
    format!(
        "{}\n{}",
        hourly("sync", 0.0, limit),
        hourly("periodic", 3600.0, limit)
    )
}

async fn a_reconfigure_applies_new_limits_and_keeps_the_counts(store: &TestStore) {
    let limiter = start(store, &both(5)).await;
    for ns in ["sync", "periodic"] {
        for _ in 0..3 {
            assert!(limiter.hit(ns, "k", 1.0).await.expect("hit").allowed());
        }
    }
    limiter
        .reconfigure(limiter.config_with(&both(3)))
        .await
        .expect("reconfigure");
    assert_eq!(limiter.status().len(), 2);
    for ns in ["sync", "periodic"] {
        let v = limiter.hit(ns, "k", 1.0).await.expect("hit");
        assert!(!v.allowed(), "{ns}: 3 counted, a new limit of 3: {v:?}");
        assert_eq!(v.decision().limit, 3.0);
    }
    limiter
        .reconfigure(limiter.config_with(&both(10)))
        .await
        .expect("reconfigure");
    for ns in ["sync", "periodic"] {
        let v = limiter.hit(ns, "k", 1.0).await.expect("hit");
        assert!(v.allowed(), "{ns}: {v:?}");
        assert_eq!(v.decision().limit, 10.0);
        assert_eq!(v.decision().remaining, 6.0, "{ns}: the counts were lost");
    }
    // a namespace added is served, one removed is not
    let next = format!("{}\n{}", hourly("sync", 0.0, 10), hourly("new", 0.0, 1));
    limiter
        .reconfigure(limiter.config_with(&next))
        .await
        .expect("reconfigure");
    let served: Vec<String> = limiter
        .status()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    assert_eq!(served, ["new", "sync"]);
    assert!(limiter.hit("new", "k", 1.0).await.expect("hit").allowed());
    assert!(!limiter.hit("new", "k", 1.0).await.expect("hit").allowed());
    let e = limiter
        .hit("periodic", "k", 1.0)
        .await
        .expect_err("retired");
    assert!(matches!(e, Error::UnknownNamespace(_)), "{e:?}");
    // the retired namespace pushed what it counted
    assert_eq!(stored(store, "periodic", "k").await, 4.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "sync", "k").await, 4.0);
    assert_eq!(stored(store, "new", "k").await, 1.0);
}

async fn a_stop_pushes_what_a_periodic_namespace_counted(store: &TestStore) {
    let namespaces = format!(
        "{}\n[[namespaces]]\nname = \"count\"\nstore = \"main\"\nwindow_sizes = [3600]\n\
         sync_rate = 3600\n",
        hourly("api", 3600.0, 5)
    );
    let limiter = start(store, &namespaces).await;
    for _ in 0..4 {
        assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    limiter
        .increment("count", "k", Some(2.5), None)
        .await
        .expect("increment");
    limiter
        .increments(
            &[("count", "k", None, None), ("count", "j", None, None)],
            10,
        )
        .await
        .expect("increments");
    limiter.stop().await.expect("stop");
    limiter.stop().await.expect("a second stop does nothing");
    assert_eq!(stored(store, "api", "k").await, 4.0);
    assert_eq!(stored(store, "count", "k").await, 3.5);
    assert_eq!(stored(store, "count", "j").await, 1.0);
    let fresh = start(store, &namespaces).await;
    assert_eq!(known(&fresh, "api", "k").await, 4.0);
    assert_eq!(known(&fresh, "count", "k").await, 3.5);
    let v = fresh.hit("api", "k", 1.0).await.expect("hit");
    assert!(v.allowed());
    assert_eq!(v.decision().remaining, 0.0);
    assert!(!fresh.hit("api", "k", 1.0).await.expect("hit").allowed());
    fresh.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 5.0);
}

/// Start, reconfigure and stop answer a `LimiterError` whose kind a caller can tell apart: a
/// `data_dir` that cannot hold the spool, a store a new config switches to that does
/// not answer (the config not taken), a reconfigure after the stop.
#[tokio::test]
async fn start_reconfigure_and_stop_fail_with_what_went_wrong() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"not a directory").expect("write");
    let sqlite = |name: &str| {
        format!(
            "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite://{}\"\n",
            dir.path().join(name).display()
        )
    };
    let text = format!(
        "data_dir = \"{}\"\n{}\n{}",
        file.join("spool").display(),
        sqlite("a.db"),
        hourly("api", 0.0, 5)
    );
    let config = Config::from_toml(&text).expect("config");
    let e = Limiter::start(config)
        .await
        .expect_err("no spool directory");
    assert!(
        e.kind() == LimiterErrorKind::DataDir && e.to_string().contains(&*file.to_string_lossy()),
        "{e:?}"
    );
    assert!(e.to_string().contains("data_dir"), "{e}");

    let running = super::start_on(&sqlite("b.db"), &hourly("api", 0.0, 5)).await;
    // a store on a port nothing listens on: refused at once, the config not taken
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let text = format!(
        "data_dir = \"{}\"\nstore_timeout = 1\n[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\n{}",
        dir.path().join("spool").display(),
        hourly("api", 0.0, 5)
    );
    let e = running
        .reconfigure(Config::from_toml(&text).expect("config"))
        .await
        .expect_err("a store that does not answer");
    assert!(
        (e.kind() == LimiterErrorKind::Store && e.to_string().starts_with("store \"main\": ping:"))
            || (e.kind() == LimiterErrorKind::StoreTimeout
                && e.to_string().starts_with("store \"main\" does not answer")),
        "{e}"
    );
    assert!(running.hit("api", "k", 1.0).await.expect("hit").allowed());
    running.stop().await.expect("stop");
    let e = running
        .reconfigure(running.config_with(&hourly("api", 0.0, 5)))
        .await
        .expect_err("stopped");
    assert_eq!(e.kind(), LimiterErrorKind::Stopped, "{e:?}");
}

/// A reload that names another `data_dir` keeps the running one: the spool an earlier
/// run left there, and the one a stop writes, stay where this node looks for them.
async fn a_reconfigure_keeps_the_running_data_dir(store: &TestStore) {
    let limiter = start(store, &hourly("api", 3600.0, 5)).await;
    let other = tempfile::tempdir().expect("dir");
    // a spool file of some other run under the new dir: read by this node only if it
    // took the new dir
    let elsewhere = other.path().join("spool");
    std::fs::create_dir_all(&elsewhere).expect("dir");
    std::fs::write(elsewhere.join("spool-0-1-00000000.json"), "[]").expect("file");
    assert_eq!(document(&limiter.node_status())["spooled_files"], 0);
    limiter
        .reconfigure(config_on(
            &store.section(),
            other.path(),
            &hourly("api", 3600.0, 6),
        ))
        .await
        .expect("reconfigure");
    assert_eq!(
        document(&limiter.node_status())["spooled_files"],
        0,
        "the spool moved with a reload"
    );
    assert_eq!(
        limiter
            .hit("api", "k", 1.0)
            .await
            .expect("hit")
            .decision()
            .limit,
        6.0,
        "the rest of the reload applies"
    );
    limiter.stop().await.expect("stop");
}

/// A reload that rebuilds a periodic namespace (its sync period changes) while a request
/// holds the namespace it replaces (a run under an idempotency key, 3 s): the old one
/// waits for it to retire, and the new one, served at once, pushes its hits on its own
/// schedule meanwhile — a node killed then loses no more than a sync period of them. (Its
/// engine started only once the old one had retired: 1.2 s after its hit the store held
/// nothing of it.)
async fn a_rebuilt_namespace_pushes_while_the_one_it_replaced_waits_to_retire(store: &TestStore) {
    use std::time::Duration;
    use swin::idempotency::{Answer, Idempotent};
    let limiter = start(store, &hourly("api", 0.2, 100)).await;
    let asked = Idempotent::new("api", "keys/held/hit", b"held-1", "POST", b"{}").expect("key");
    let held = limiter.once(asked, async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Answer::new(200, Vec::new(), b"{}".to_vec())
    });
    let rest = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let reload = limiter.reconfigure(limiter.config_with(&hourly("api", 0.3, 100)));
        let hit = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
            tokio::time::sleep(Duration::from_millis(1200)).await;
            stored(store, "api", "k").await
        };
        let (reloaded, stored) = tokio::join!(reload, hit);
        reloaded.expect("reconfigure");
        stored
    };
    let (once, pushed) = tokio::join!(held, rest);
    once.expect("the held request");
    assert_eq!(
        pushed, 1.0,
        "the rebuilt namespace's hit was not pushed on its schedule"
    );
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 1.0);
}

/// A caller that drops `reconfigure` or `stop` at its first wait (a timeout, a `select!`)
/// loses nothing: the change, or the stop's last push, finishes without it. Dropped
/// mid-way, a reconfigure had taken the unchanged namespace out of what it runs (so no
/// stop pushed it), and a stop had taken what it stops (so nothing pushed or spooled).
async fn a_reconfigure_or_stop_dropped_midway_still_finishes(store: &TestStore) {
    let zero = std::time::Duration::ZERO;
    let limiter = start(store, &hourly("api", 3600.0, 100)).await;
    for _ in 0..4 {
        assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    // the added namespace waits on its store: run inline, the first poll could not
    // finish (on a task of its own, it may)
    let next = format!(
        "{}\n{}",
        hourly("api", 3600.0, 100),
        hourly("added", 3600.0, 1)
    );
    let _ = tokio::time::timeout(zero, limiter.reconfigure(limiter.config_with(&next))).await;
    // it finishes on its own: the added namespace comes to be served
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while limiter.serves("added").is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the reconfigure never finished"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(limiter.hit("added", "k", 1.0).await.expect("hit").allowed());
    let _ = tokio::time::timeout(zero, limiter.stop()).await;
    // a second stop waits for the first
    limiter.stop().await.expect("a second stop");
    assert_eq!(stored(store, "api", "k").await, 4.0);
    assert_eq!(stored(store, "added", "k").await, 1.0);
}

/// A stop that failed (here: the store unreachable and the spool unwritable) while its
/// caller had stopped waiting hands its error to the next stop, which used to answer
/// `Ok` (the hits lost, and nobody told); a stop after that answers `Ok`.
#[tokio::test]
async fn a_failed_stop_nobody_waited_for_tells_the_next_stop() {
    let dir = tempfile::tempdir().expect("temp dir");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let spool = dir.path().join("spool");
    let text = format!(
        "data_dir = \"{}\"\nstore_timeout = 1\nshutdown_grace = 1\n\
         [stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{port}\"\n{}",
        spool.display(),
        hourly("api", 3600.0, 5)
    );
    let limiter = Limiter::start(Config::from_toml(&text).expect("config"))
        .await
        .expect("a store that does not answer yet does not hold up the start");
    assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    // the spool cannot be written now: its directory is a file
    let _ = std::fs::remove_dir_all(&spool);
    std::fs::write(&spool, b"not a directory").expect("write");
    let _ = tokio::time::timeout(std::time::Duration::ZERO, limiter.stop()).await;
    let e = limiter.stop().await.expect_err("the first stop's error");
    assert!(
        e.kind() == LimiterErrorKind::Spool && e.to_string().starts_with("lost 1 windows "),
        "{e:?}"
    );
    limiter.stop().await.expect("the error is told once");
}
