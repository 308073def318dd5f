//! The engine's loop: the timer that pushes and fetches every period (a second for
//! synchronous and local-only namespaces, to push fallback hits and drop expired
//! entries), with capped backoff after a failure; the syncs asked for over the API,
//! which share one run; and the queue of what rounds drained ([`PushState`]), which every
//! round, synchronous flush and the last push take in turn. What one round does is in
//! `periodic.rs`, the last push in `stopping.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::pace::Pace;
use super::rows::PushState;
use super::{now, NamespaceSync, SyncMode, SyncReport};
use crate::backoff::Backoff;
use crate::StoreError;

/// One namespace's loop (see the module's note).
#[derive(Debug, Default)]
pub(super) struct SyncLoop {
    /// What rounds drained and queue under their sequence numbers, until the store
    /// confirms it: one round (or flush, or last push) at a time.
    pub(super) state: tokio::sync::Mutex<PushState>,
    /// `requested.runs`, readable without waiting for the lock.
    requested_runs: AtomicU64,
    /// Syncs asked for over the API: one runs, the requests that queued behind it take
    /// its outcome instead of each scanning the store again.
    requested: tokio::sync::Mutex<RequestedSync>,
}

/// The last sync run for a request, and how many have run.
#[derive(Debug, Default)]
struct RequestedSync {
    runs: u64,
    last: Option<Result<SyncReport, Arc<StoreError>>>,
}

impl SyncLoop {
    /// A sync asked for over the API, or the outcome of the one that ran while this one
    /// waited.
    pub(super) async fn requested(
        &self,
        sync: &NamespaceSync,
        now: UnixMs,
    ) -> Result<SyncReport, Arc<StoreError>> {
        let seen = self.requested_runs.load(Ordering::Acquire);
        let mut r = self.requested.lock().await;
        if r.runs > seen {
            if let Some(last) = &r.last {
                return last.clone();
            }
        }
        let outcome = sync.sync_once(now).await.map_err(Arc::new);
        r.runs += 1;
        r.last = Some(outcome.clone());
        self.requested_runs.store(r.runs, Ordering::Release);
        outcome
    }

    /// Runs `sync`'s rounds until `cancel`, then hands back its quota and pushes once
    /// more.
    pub(super) async fn run(&self, sync: &Arc<NamespaceSync>, cancel: CancellationToken) {
        let period = match sync.mode {
            SyncMode::Periodic(p) => p,
            SyncMode::Synchronous | SyncMode::LocalOnly => Duration::from_secs(1),
        };
        // in synchronous mode the loop is also what finds a failing store again: it
        // tries at least every five seconds
        let cap = match sync.mode {
            SyncMode::Synchronous => Duration::from_secs(5),
            _ => Duration::from_secs(30),
        };
        let mut backoff = Backoff::new(period.max(Duration::from_millis(100)), cap);
        let mut next = tokio::time::Instant::now() + period;
        let returner = sync.strict.return_unused_task(sync, &cancel);
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
            }
            // a tick spaces its store calls over up to half its period (engine/pace.rs)
            match sync.sync_paced(now(), Pace::within(period / 2)).await {
                Ok(report) => {
                    sync.measure_clock().await;
                    if backoff.failures() > 0 {
                        info!(
                            namespace = sync.name(),
                            pushed = report.pushed,
                            "store reachable again"
                        );
                    }
                    backoff.reset();
                    debug!(
                        namespace = sync.name(),
                        pushed = report.pushed,
                        fetched = report.fetched,
                        "synced"
                    );
                    // missed ticks are skipped, never burst
                    next += period;
                    let t = tokio::time::Instant::now();
                    if next < t {
                        next = t + period;
                    }
                }
                Err(e) => {
                    let delay = backoff.next_delay();
                    warn!(namespace = sync.name(), cause = %e, transient = e.is_transient(), retry_in_ms = delay.as_millis() as u64, "sync failed");
                    next = tokio::time::Instant::now() + delay;
                }
            }
        }
        // synchronous increments and holds still on their way to the store land (or
        // fall back to the tables) before the last push drains them
        sync.flushes.close();
        sync.flushes.wait().await;
        if let Some(returner) = returner {
            let _ = returner.await;
            // then all unused quota goes back
            sync.strict.return_all(sync).await;
        }
        sync.final_push().await;
    }
}
