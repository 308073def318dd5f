//! Store calls that race: a sync's read of a key, sent before a synchronous round trip
//! on it was answered and answered after it, leaves the round trip's newer count; so
//! does a start's load answered after a first touch read the key.

use super::*;

/// The store's count of `k` in the hour of `now`.
async fn stored(s: &TestStore, now: UnixMs) -> f64 {
    let window = WindowKey {
        key: "k".into(),
        window_size: 3600,
        window_start: WindowSize::new(3600).expect("size").start_of(now),
    };
    let totals = s.store.read("api", &[window]).await.expect("read");
    totals.iter().map(|t| t.count).sum()
}

/// A synchronous engine holds `k` at 2. A sync's read of `k` is sent, and its answer
/// (2) held back; meanwhile an increment of 1 goes through the store (3, and the node's
/// count 3). The read's answer, applied last, used to set the node's count back to 2
/// until the next sync (a read of the key after the node had answered 3 said 2).
pub(super) async fn a_sync_read_answered_after_a_round_trip_leaves_its_newer_count(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine(&faulty, SyncMode::Synchronous, &[3600]);
    // one instant for every call: the same windows, whenever the test runs
    let now = UnixMs::from_system_time(std::time::SystemTime::now());
    let r = e.increment("k", 3600, 2.0, now).await.expect("first");
    assert_eq!(r.current, 2.0, "{r:?}");
    // the sync's first call is its read of k (nothing to push: the round trip did)
    control.plan([Fault::Slow(Duration::from_millis(800))]);
    let sync = tokio::spawn({
        let e = e.clone();
        async move { e.sync_once(now).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = e.increment("k", 3600, 1.0, now).await.expect("second");
    assert_eq!(r.current, 3.0, "{r:?}");
    sync.await.expect("sync task").expect("sync");
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(
        r.current, 3.0,
        "the node's count after the late read: {r:?}"
    );
    assert_eq!(stored(s, now).await, 3.0);
}

/// A periodic engine's first touch of `k` (the store holds 1) whose answer comes after
/// the caller stopped waiting for it (`answer_within`, 500 ms): the node counts 2 on
/// its own, a sync pushes them and brings the store's 3 back, and then the first
/// touch's answer lands, 1. It used to overwrite the sync's 3 (the node read 1 until its
/// next sync); a key held by then keeps what it holds.
pub(super) async fn a_first_touch_answered_after_a_sync_leaves_its_newer_count(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine(
        &faulty,
        SyncMode::Periodic(Duration::from_secs(60)),
        &[3600],
    );
    let now = UnixMs::from_system_time(std::time::SystemTime::now());
    let other = engine(
        &s.store,
        SyncMode::Periodic(Duration::from_secs(60)),
        &[3600],
    );
    other.increment("k", 3600, 1.0, now).await.expect("other");
    other.sync_once(now).await.expect("other's sync");
    control.plan([Fault::Slow(Duration::from_millis(1500))]);
    e.first_touch(&["k"]).await;
    assert_eq!(e.first_touches().1, 1, "the caller stopped waiting");
    e.increment("k", 3600, 2.0, now)
        .await
        .expect("counted here");
    e.sync_once(now).await.expect("sync");
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(r.current, 3.0, "after the sync: {r:?}");
    // past the first touch's answer
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(r.current, 3.0, "after the first touch's answer: {r:?}");
    assert_eq!(stored(s, now).await, 3.0);
}

/// A node starts: its load of the namespace's totals is sent when the store holds 1 for
/// `k`, and its answer held back; meanwhile another node counts 2 more and pushes them,
/// and this node's first touch of `k` reads the store's 3. The load's answer, landing
/// last, used to set the key back to 1 (the node decided on 1 until its next sync, an
/// hour here); a key held by then keeps what it holds.
pub(super) async fn a_start_load_answered_after_a_first_touch_leaves_its_newer_count(
    s: &TestStore,
) {
    let (faulty, control) = common::faulty(&s.store);
    let hourly = SyncMode::Periodic(Duration::from_secs(3600));
    let e = engine(&faulty, hourly, &[3600]);
    let now = UnixMs::from_system_time(std::time::SystemTime::now());
    let other = engine(&s.store, hourly, &[3600]);
    other.increment("k", 3600, 1.0, now).await.expect("other");
    other.sync_once(now).await.expect("other's sync");
    control.plan([Fault::Slow(Duration::from_millis(1500))]);
    let load = tokio::spawn({
        let e = e.clone();
        async move { e.warm_up(now).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.increment("k", 3600, 2.0, now).await.expect("other");
    other.sync_once(now).await.expect("other's sync");
    e.first_touch(&["k"]).await;
    assert_eq!(e.first_touches().0, 1, "the first touch read the store");
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(r.current, 3.0, "after the first touch: {r:?}");
    load.await.expect("load task").expect("load");
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(r.current, 3.0, "after the load's answer: {r:?}");
    assert_eq!(stored(s, now).await, 3.0);
}

/// As above, and a tick runs between the first touch and the load's answer: the tick
/// used to drop every stamp (no sync call of its own was out), so the load's answer,
/// landing after it, set the key back to 1 all the same.
pub(super) async fn a_tick_while_a_start_load_is_out_keeps_a_first_touch_count(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let hourly = SyncMode::Periodic(Duration::from_secs(3600));
    let e = engine(&faulty, hourly, &[3600]);
    let now = UnixMs::from_system_time(std::time::SystemTime::now());
    let other = engine(&s.store, hourly, &[3600]);
    other.increment("k", 3600, 1.0, now).await.expect("other");
    other.sync_once(now).await.expect("other's sync");
    control.plan([Fault::Slow(Duration::from_millis(1500))]);
    let load = tokio::spawn({
        let e = e.clone();
        async move { e.warm_up(now).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    other.increment("k", 3600, 2.0, now).await.expect("other");
    other.sync_once(now).await.expect("other's sync");
    e.first_touch(&["k"]).await;
    assert_eq!(e.first_touches().0, 1, "the first touch read the store");
    e.sync_once(now)
        .await
        .expect("a tick while the load is out");
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(r.current, 3.0, "after the tick: {r:?}");
    load.await.expect("load task").expect("load");
    let r = e.counters().rate("k", 3600, now, None).expect("size");
    assert_eq!(r.current, 3.0, "after the load's answer: {r:?}");
    assert_eq!(stored(s, now).await, 3.0);
}

/// A first touch of 200 keys in a namespace of two window sizes: the read goes in calls
/// of 500 windows (the minute's windows of every key first, then the hour's), and each
/// key's windows of each size are filled, whichever call brought them. Applying each
/// call as it came used to skip the hour of every key the minute's calls had filled
/// (150 keys read 0 for the hour where the store held 1).
pub(super) async fn a_first_touch_of_many_keys_fills_every_size(s: &TestStore) {
    let hourly = SyncMode::Periodic(Duration::from_secs(3600));
    let sizes = [60u32, 3600];
    let e = engine(&s.store, hourly, &[60, 3600]);
    let other = engine(&s.store, hourly, &[60, 3600]);
    let now = UnixMs::from_system_time(std::time::SystemTime::now());
    let keys: Vec<String> = (0..200).map(|i| format!("k{i:03}")).collect();
    for k in &keys {
        for size in sizes {
            other.increment(k, size, 1.0, now).await.expect("other");
        }
    }
    other.sync_once(now).await.expect("other's sync");
    let asked: Vec<&str> = keys.iter().map(String::as_str).collect();
    e.first_touch(&asked).await;
    assert_eq!(e.first_touches(), (200, 0), "every key read from the store");
    let mut wrong = Vec::new();
    for k in &keys {
        for size in sizes {
            let r = e.counters().rate(k, size, now, None).expect("size");
            if r.current != 1.0 {
                wrong.push((k.clone(), size, r.current));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} windows not as stored: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );
}
