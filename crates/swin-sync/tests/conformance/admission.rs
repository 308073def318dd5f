//! Admission over a store: an undo takes back in the windows its take counted in, even
//! when it comes after that window has ended (eventual, synchronous and strict).

use swin_core::{WindowAlgorithm, WindowLimit};
use swin_sync::admission::{for_namespace, Admission, Bounds, GiveBack, OnStoreFailure, Spend};
use tokio_util::sync::CancellationToken;

use super::*;

/// 100 ms before the end of the window `CUR`, and 100 ms into the next.
const LAST_MS: i64 = (CUR + 60) * 1000 - 100;
const NEXT_MS: i64 = (CUR + 60) * 1000 + 100;

fn admission(
    store: &Store,
    mode: SyncMode,
    strict: bool,
) -> (Arc<NamespaceSync>, Arc<dyn Admission>) {
    let size = WindowSize::new(60).expect("size");
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &[size],
        CounterOptions::default(),
    ));
    let sync = NamespaceSync::new(
        counters,
        mode,
        Some(store.clone()),
        swin_sync::new_node_id().into(),
        Duration::from_secs(5),
    );
    for_namespace(sync, false, strict.then_some(OnStoreFailure::Deny))
}

/// Takes 3 and 5 just before a window's end and 2 just after, then undoes the 5 (its
/// request refused as a whole), later still: the window it was taken in holds exactly
/// 3 and the next exactly 2 (the undo lowered neither the next window nor the one of its
/// own time).
async fn an_undo_counts_in_the_window_of_its_take(
    store: &Store,
    mode: SyncMode,
    strict: bool,
    key: &str,
) {
    let (sync, admission) = admission(store, mode, strict);
    let cancel = CancellationToken::new();
    let run = tokio::spawn(sync.clone().run(cancel.clone()));
    let limit = WindowLimit::new(
        WindowSize::new(60).expect("size"),
        100.0,
        WindowAlgorithm::Sliding,
    )
    .expect("limit");
    let set = [limit];
    let bounds = Bounds::Windows(&set);
    for (cost, at) in [(3.0, LAST_MS), (5.0, LAST_MS), (2.0, NEXT_MS)] {
        let a = admission
            .take(key, bounds, cost, Spend::IfAllowed, UnixMs(at))
            .await
            .expect("take");
        assert!(a.decision.allowed, "{cost} at {at}: {a:?}");
    }
    let undo = GiveBack::Undo {
        at: UnixMs(LAST_MS),
    };
    let back = admission
        .give_back(key, bounds, 5.0, undo)
        .await
        .expect("undo");
    assert_eq!(back.given, 5.0);
    // every count (and every unused hold) reaches the store
    if let SyncMode::Periodic(_) = mode {
        sync.sync_once(UnixMs(NEXT_MS)).await.expect("sync");
    }
    cancel.cancel();
    run.await.expect("run");
    assert_eq!(
        totals(store, "api", &[wk(key, CUR), wk(key, CUR + 60)]).await,
        vec![(key.into(), CUR, 3.0), (key.into(), CUR + 60, 2.0)],
        "{mode:?}, strict {strict}"
    );
}

pub(super) async fn an_undo_after_a_window_ends_takes_back_in_its_take_s_window(s: &TestStore) {
    let st = &s.store;
    let periodic = SyncMode::Periodic(Duration::from_secs(3600));
    an_undo_counts_in_the_window_of_its_take(st, periodic, false, "eventual").await;
    let sync = SyncMode::Synchronous;
    an_undo_counts_in_the_window_of_its_take(st, sync, false, "synchronous").await;
    an_undo_counts_in_the_window_of_its_take(st, periodic, true, "strict").await;
}
