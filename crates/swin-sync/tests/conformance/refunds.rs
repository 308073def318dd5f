//! Refunds through a synchronous engine whose store came back: what a refund answers
//! is in the store when it answers, exactly, even before a sync has closed the breaker.

use swin_core::{WindowAlgorithm, WindowLimit};
use swin_sync::admission::{Admission, Bounds, GiveBack};

use super::*;

/// A window of an hour: a refund reads the clock itself (`swin_sync::now`).
const HOUR: u32 = 3600;

/// A refund of `cost` on `key` under a limit of 5 an hour.
async fn refund(admission: &dyn Admission, key: &str, cost: f64) -> f64 {
    let size = WindowSize::new(HOUR.into()).expect("size");
    let limit = WindowLimit::new(size, 5.0, WindowAlgorithm::Fixed).expect("limit");
    admission
        .give_back(key, Bounds::Windows(&[limit]), cost, GiveBack::Refund)
        .await
        .expect("the store answers the refund's read")
        .given
}

/// The store's count of `key` in the current hour.
async fn stored(store: &Store, key: &str) -> f64 {
    let size = WindowSize::new(HOUR.into()).expect("size");
    let window = WindowKey {
        key: key.into(),
        window_size: size.secs(),
        window_start: size.start_of(swin_sync::now()),
    };
    let totals = store.read("api", &[window]).await.expect("read");
    totals.first().map_or(0.0, |t| t.count)
}

/// A synchronous namespace whose store went away and came back, the breaker still open
/// (no sync has reached the store yet, as while the sync loop backs off): a refund reads
/// the key's count from the store and gives back there, not only in this node's memory
/// until a later sync; and only as far as the store's count goes, the rest out of the
/// hits this node counted while the store was gone (the store stops a count at zero,
/// and those hits, pushed later, would add back what the refund took there).
pub(super) async fn a_refund_after_an_outage_is_in_the_store_at_once(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &[WindowSize::new(HOUR.into()).expect("size")],
        CounterOptions::default(),
    ));
    let sync = NamespaceSync::new(
        counters,
        SyncMode::Synchronous,
        Some(faulty),
        swin_sync::new_node_id().into(),
        Duration::from_secs(5),
    );
    let (e, admission) = swin_sync::admission::for_namespace(sync, false, None);
    let now = swin_sync::now();
    for _ in 0..5 {
        e.increment("k", HOUR, 1.0, now).await.expect("inc");
    }
    assert_eq!(stored(&s.store, "k").await, 5.0);
    control.set_down(true);
    // while the store is gone: a hit of "j" counted here only, and the breaker opens
    e.increment("j", HOUR, 2.0, now)
        .await
        .expect("answered from local memory");
    assert!(e.status().degraded.is_some(), "{:?}", e.status());
    control.set_down(false);

    assert_eq!(refund(admission.as_ref(), "k", 2.0).await, 2.0);
    assert_eq!(
        stored(&s.store, "k").await,
        3.0,
        "the refund is in the store"
    );
    // "j": the store holds nothing of it yet, this node 2 not pushed
    assert_eq!(refund(admission.as_ref(), "j", 2.0).await, 2.0);
    e.sync_once(now).await.expect("a sync reaches the store");
    assert_eq!(stored(&s.store, "j").await, 0.0, "nothing added back");
    assert_eq!(stored(&s.store, "k").await, 3.0);
}
