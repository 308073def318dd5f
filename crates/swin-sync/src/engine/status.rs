//! The engine's health, for readiness and metrics: what the last syncs did, and a
//! histogram of their durations.

use super::{now, NamespaceSync, SyncReport};
use crate::StoreError;

/// The engine's health, for readiness and metrics.
#[derive(Debug, Clone, Default)]
pub struct SyncStatus {
    /// Unix milliseconds of the last sync that reached the store.
    pub last_success_ms: Option<i64>,
    /// Why the last attempt failed, while the store is unreachable: a short reason
    /// ([`StoreError::reason`]); the detail is in the log.
    pub degraded: Option<&'static str>,
    /// Window diffs drained but not yet confirmed by the store.
    pub pending_diffs: usize,
    /// GCRA TAT advances drained but not yet confirmed by the store.
    pub pending_advances: usize,
    pub syncs: u64,
    pub failures: u64,
    /// Windows the store refused for good (logged with their key and dropped).
    pub rejected_windows: u64,
    /// Syncs per duration bucket of [`SYNC_BUCKETS_SECS`] (not cumulative).
    pub duration_buckets: [u64; SYNC_BUCKETS_SECS.len()],
    pub duration_sum_secs: f64,
}

/// Upper bounds (seconds) of the sync duration histogram.
pub const SYNC_BUCKETS_SECS: [f64; 10] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0];

impl NamespaceSync {
    /// What is queued for the store: diffs and advances drained and not yet confirmed.
    pub(super) fn set_pending(&self, diffs: usize, advances: usize) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        s.pending_diffs = diffs;
        s.pending_advances = advances;
    }

    /// The outcome of a sync, or of a synchronous call that failed.
    pub(super) fn record(&self, outcome: Result<&SyncReport, &StoreError>) {
        let mut s = self.status.lock().unwrap_or_else(|p| p.into_inner());
        match outcome {
            Ok(report) => {
                if self.session.close() {
                    tracing::info!(
                        namespace = self.name(),
                        "store reached again: synchronous calls go to it again"
                    );
                }
                s.last_success_ms = Some(now().0);
                s.degraded = None;
                s.syncs += 1;
                let secs = report.duration_ms / 1e3;
                s.duration_sum_secs += secs;
                if let Some(i) = SYNC_BUCKETS_SECS.iter().position(|le| secs <= *le) {
                    s.duration_buckets[i] += 1;
                }
            }
            Err(e) => {
                s.degraded = Some(e.reason());
                s.failures += 1;
            }
        }
    }
}
