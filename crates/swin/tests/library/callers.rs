//! A caller that goes away after its ask reached the store: what it asked lands whole or
//! not at all, never in part; and a hit the store holds up lands, exactly once, after its
//! caller left. The store is held up the way each can be: SQLite by another connection
//! holding its write lock, Redis by a proxy that holds every byte.

use std::time::Duration;

use swin_testkit::cluster::HoldProxy;
use swin_testkit::TestStore;

use super::{hourly, start, start_on, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_batch_whose_caller_went_away_counts_whole_or_not_at_all,
    a_hit_held_up_by_the_store_lands_once_after_its_caller_left,
    a_hit_answered_before_the_store_did_lands_once,
]);

/// A batch over two keys of two synchronous namespaces, its caller gone after the first
/// poll (the ask on its way to the store), again and again: each time both hits land or
/// neither does.
async fn a_batch_whose_caller_went_away_counts_whole_or_not_at_all(store: &TestStore) {
    let namespaces = format!("{}\n{}", hourly("a", 0.0, 1000), hourly("b", 0.0, 1000));
    let limiter = start(store, &namespaces).await;
    let mut answered = 0;
    for i in 0..20 {
        let key = format!("k{i}");
        let hits = [("a", key.as_str(), 1.0), ("b", key.as_str(), 1.0)];
        let batch = limiter.hits(&hits, false, 10);
        // every other time, the caller waits a millisecond before it goes
        let patience = Duration::from_millis(i % 2);
        if tokio::time::timeout(patience, batch).await.is_ok() {
            answered += 1;
        }
    }
    assert!(answered < 20, "every caller had its answer before it left");
    // what went on after the callers left has ended within a second
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (a, b) = (store.totals("a").await, store.totals("b").await);
    for i in 0..20 {
        let key = format!("k{i}");
        let (in_a, in_b) = (
            a.get(&key).copied().unwrap_or(0.0),
            b.get(&key).copied().unwrap_or(0.0),
        );
        assert!(
            (in_a, in_b) == (1.0, 1.0) || (in_a, in_b) == (0.0, 0.0),
            "{key}: a holds {in_a}, b holds {in_b} (answered before the caller left: {answered})"
        );
        // it was polled, so it was on its way: it runs to its end
        assert_eq!(
            in_a, 1.0,
            "{key}: the batch reached the pipeline and was lost"
        );
    }
    limiter.stop().await.expect("stop");
}

/// The store holds up a synchronous hit; its caller leaves before the answer; once the
/// store answers again the hit is in it, once, and the limiter knows it.
async fn a_hit_held_up_by_the_store_lands_once_after_its_caller_left(store: &TestStore) {
    let mut held = Held::new(store).await;
    let limiter = start_on(&held.section, &hourly("api", 0.0, 10)).await;
    // the key's first hit, so that it has been read and the connection is up
    assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    assert_eq!(stored(store, "api", "k").await, 1.0);
    held.hold().await;
    let left = tokio::time::timeout(Duration::from_millis(50), limiter.hit("api", "k", 1.0)).await;
    assert!(left.is_err(), "answered while the store was held: {left:?}");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        stored(store, "api", "k").await,
        1.0,
        "the store took the hit while held"
    );
    held.release().await;
    swin_testkit::cluster::within(Duration::from_secs(5), "the hit lands", async || {
        stored(store, "api", "k").await == 2.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stored(store, "api", "k").await, 2.0, "the hit landed twice");
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    assert_eq!(v.decision().remaining, 7.0, "{v:?}");
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
}

/// The store holds up a synchronous hit past `answer_timeout`: the caller is answered
/// from what the limiter knows, the store call goes on, and once the store answers the
/// hit is in it once — not once for the call and again for the answer.
async fn a_hit_answered_before_the_store_did_lands_once(store: &TestStore) {
    let mut held = Held::new(store).await;
    let limiter = start_on(&held.section, &hourly("api", 0.0, 10)).await;
    assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    held.hold().await;
    let v = tokio::time::timeout(Duration::from_secs(3), limiter.hit("api", "k", 1.0))
        .await
        .expect("answered within answer_timeout")
        .expect("hit");
    assert!(v.allowed(), "{v:?}");
    assert_eq!(stored(store, "api", "k").await, 1.0);
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.release().await;
    swin_testkit::cluster::within(Duration::from_secs(5), "the hit lands", async || {
        stored(store, "api", "k").await >= 2.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(stored(store, "api", "k").await, 2.0);
    limiter.stop().await.expect("stop");
    assert_eq!(
        stored(store, "api", "k").await,
        2.0,
        "the stop pushed the hit a second time"
    );
}

/// A store that can be held up: SQLite's write lock taken by another connection, or a
/// proxy to Redis that holds every byte.
struct Held {
    /// The `[stores.main]` a limiter reaches the store through.
    section: String,
    how: How,
}

enum How {
    Sqlite {
        url: String,
        lock: Option<sqlx::SqliteConnection>,
    },
    Redis(HoldProxy),
}

impl Held {
    async fn new(store: &TestStore) -> Held {
        match store.sqlite_path() {
            Some(_) => Held {
                section: store.section(),
                how: How::Sqlite {
                    url: store.url.clone(),
                    lock: None,
                },
            },
            None => {
                let proxy = HoldProxy::start(HoldProxy::target_of(&store.url)).await;
                Held {
                    section: store
                        .section()
                        .replace(&store.url, &proxy.url_for(&store.url)),
                    how: How::Redis(proxy),
                }
            }
        }
    }

    async fn hold(&mut self) {
        use sqlx::Connection;
        match &mut self.how {
            How::Sqlite { url, lock } => {
                let mut c = sqlx::SqliteConnection::connect(url).await.expect("open");
                sqlx::query("BEGIN EXCLUSIVE")
                    .execute(&mut c)
                    .await
                    .expect("lock");
                *lock = Some(c);
            }
            How::Redis(proxy) => proxy.hold(),
        }
    }

    async fn release(&mut self) {
        use sqlx::Connection;
        match &mut self.how {
            How::Sqlite { lock, .. } => {
                if let Some(mut c) = lock.take() {
                    sqlx::query("ROLLBACK")
                        .execute(&mut c)
                        .await
                        .expect("unlock");
                    c.close().await.expect("close");
                }
            }
            How::Redis(proxy) => proxy.release(),
        }
    }
}
