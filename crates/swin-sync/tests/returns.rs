//! Strict admission's returns of ended windows only ever lower what the store holds for
//! the node (a return asks for no room: its limit is 0): a commit's give-back into an
//! ended window, returned at once, is what the store keeps, though the engine's return of
//! the same window (carrying it as it was before the give-back) was sent first and
//! reached the store last.

mod common;

use std::sync::Arc;
use std::time::Duration;

use swin_core::{
    CounterOptions, NamespaceCounters, UnixMs, WindowAlgorithm, WindowLimit, WindowSize,
};
use swin_sync::admission::Holds;
use swin_sync::store::Fault;
use swin_sync::{now, NamespaceSync, PushId, QuotaKeeper, SyncMode, WindowKey};
use swin_testkit::TestStore;

/// Sleeps until `ms` milliseconds into the next second.
async fn into_the_next_second(ms: i64) {
    let t = now().0;
    let next = (t / 1000 + 1) * 1000 + ms;
    tokio::time::sleep(Duration::from_millis((next - t) as u64)).await;
}

/// 107 held and used in a one-second window; the window ends and the key's slot rolls;
/// the engine's return of it (at 107) is slow on its way to the store, and meanwhile a
/// commit gives 60 back into it and returns it at once (at 47). The store keeps 47: the
/// engine's return, landing last, cannot take back what the commit gave.
async fn a_give_back_racing_the_engines_return_is_what_the_store_keeps(s: &TestStore) {
    let (faulty, faults) = common::faulty(&s.store);
    let size = WindowSize::new(1).expect("size");
    let counters = Arc::new(NamespaceCounters::new(
        "strict",
        &[size],
        CounterOptions::default(),
    ));
    let push = PushId::from(swin_sync::new_node_id());
    let holds = Arc::new(Holds::new(&push));
    // not run: the returns below are the only ones
    let engine = Arc::new(
        NamespaceSync::new(
            counters,
            SyncMode::Periodic(Duration::from_secs(3600)),
            Some(faulty),
            push,
            Duration::from_secs(5),
        )
        .with_quota(holds.clone()),
    );
    let l = WindowLimit::new(size, 1_000.0, WindowAlgorithm::Fixed).expect("limit");
    into_the_next_second(100).await;
    let start = size.start_of(now());
    let taken = holds
        .admit(&engine, "k", &[l], 107.0, now())
        .await
        .expect("admit");
    assert!(taken[0].allowed, "{taken:?}");
    assert_eq!(start, size.start_of(now()), "the window ended too soon");
    // the next window: a hit of nothing rolls the slot, the ended window to go back
    into_the_next_second(50).await;
    holds
        .admit(&engine, "k", &[l], 0.0, now())
        .await
        .expect("roll");
    faults.plan([Fault::Late(Duration::from_millis(500))]);
    let tick = {
        let (holds, engine) = (holds.clone(), engine.clone());
        tokio::spawn(async move { holds.return_unused(&engine, now(), false).await })
    };
    // the engine's return has taken the window as it is (107) and is on its way
    tokio::time::sleep(Duration::from_millis(50)).await;
    let at = UnixMs(start * 1000 + 10);
    assert_eq!(holds.give_back("k", &[l], 60.0, at, false), 60.0);
    holds.return_ended(&engine, "k", &[l]).await;
    assert!(tick.await.expect("tick"), "the engine's return answered");
    let w = [WindowKey {
        key: "k".into(),
        window_size: 1,
        window_start: start,
    }];
    let count = s.store.read("strict", &w).await.expect("read");
    assert_eq!(
        count.first().map(|t| t.count),
        Some(47.0),
        "the ended window holds what was used less what was given back"
    );
}

swin_testkit::for_stores!([postgres, redis, sqlite] [
    a_give_back_racing_the_engines_return_is_what_the_store_keeps,
]);
