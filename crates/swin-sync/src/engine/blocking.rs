//! Table work off the runtime: CPU-bound walks of a namespace's tables on tokio's
//! blocking pool.

use crate::StoreError;

/// Runs CPU-bound table work (draining, applying totals, listing active keys) on
/// tokio's blocking pool, so the OS, not the cooperative scheduler, shares the core
/// with requests. A panic in it is a bug: it is raised here again.
///
/// A runtime that is shutting down runs no more of this work: the pool drops it
/// without calling it (a task it has started always runs to its end), and the caller
/// is told so, with an error it handles as a store it could not ask. Nothing is lost
/// by that: a drain that never ran left every diff in the tables, where the engine's
/// last push or its hand-over of what is unconfirmed finds them.
pub(super) async fn off_runtime<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, StoreError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(v) => Ok(v),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(StoreError::Unavailable(
            "the runtime is shutting down: table work was not run".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use swin_core::{CounterOptions, NamespaceCounters, UnixMs, WindowSize};

    use super::off_runtime;
    use crate::store::SqliteStore;
    use crate::{NamespaceSync, Store, SyncMode};

    /// A runtime that is shutting down runs no more blocking work: the work is dropped
    /// unrun and its caller is told, without a panic.
    #[test]
    fn work_a_stopping_runtime_will_not_run_is_an_error_not_a_panic() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .expect("runtime");
        let handle = rt.handle().clone();
        rt.shutdown_background();
        let ran = Arc::new(AtomicBool::new(false));
        let work = {
            let ran = ran.clone();
            move || ran.store(true, Ordering::SeqCst)
        };
        let outcome = handle.block_on(off_runtime(work));
        assert!(
            matches!(&outcome, Err(e) if e.is_transient()),
            "{outcome:?}"
        );
        assert!(!ran.load(Ordering::SeqCst), "the work did not run");
    }

    /// A sync whose drain the stopping runtime never ran fails, and every hit is still
    /// in the tables: what the engine hands over unconfirmed holds it.
    #[test]
    fn a_sync_the_stopping_runtime_did_not_drain_keeps_every_hit() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let handle = rt.handle().clone();
        let store = rt
            .block_on(SqliteStore::connect("sqlite::memory:"))
            .expect("store");
        let size = WindowSize::new(60).expect("size");
        let counters = Arc::new(NamespaceCounters::new(
            "api",
            &[size],
            CounterOptions::default(),
        ));
        let engine = NamespaceSync::new(
            counters.clone(),
            SyncMode::Periodic(Duration::from_secs(1)),
            Some(Store::Sqlite(store)),
            "n1".into(),
            Duration::from_secs(1),
        );
        let now = UnixMs(1_700_000_000_000);
        counters
            .table(60)
            .expect("table")
            .increment("k", 5.0, now)
            .expect("counted");
        rt.shutdown_background();
        let synced = handle.block_on(engine.sync_once(now));
        assert!(matches!(&synced, Err(e) if e.is_transient()), "{synced:?}");
        let left = handle.block_on(engine.take_unconfirmed(now));
        assert_eq!((left.rows(), left.hits()), (1, 5.0), "{left:?}");
    }
}
