//! Strict admission's quota, as the engine sees it: owned by the namespace's admission
//! ([`crate::admission`]), returned to the store when the engine's loop says so.

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{now, NamespaceSync};

/// How often a strict namespace returns quota of ended windows and idle keys to the store.
const RETURN_EVERY: Duration = Duration::from_millis(250);

/// Quota a strict namespace holds from the store, owned by its admission. The engine's
/// loop asks it to return what is unused every `RETURN_EVERY` (250 ms), and everything
/// unused at stop, before the last push.
pub trait QuotaKeeper: Send + Sync + std::fmt::Debug {
    /// Returns to the store what ended windows and idle keys hold unused (`all`:
    /// everything unused) and forgets what is settled. True when nothing is left to return.
    fn return_unused<'a>(
        &'a self,
        sync: &'a Arc<NamespaceSync>,
        now: UnixMs,
        all: bool,
    ) -> futures_util::future::BoxFuture<'a, bool>;

    /// Keys (per window size, or buckets) it keeps state for.
    fn tracked(&self) -> usize;

    /// Store calls made so far.
    fn round_trips(&self) -> u64;
}

/// Strict admission as the engine holds it: the quota its admission admits from (none
/// for an eventual namespace), which the engine's loop has return what is unused.
#[derive(Debug, Default)]
pub(super) struct StrictQuota {
    keeper: Option<Arc<dyn QuotaKeeper>>,
}

impl StrictQuota {
    pub(super) fn new(keeper: Arc<dyn QuotaKeeper>) -> Self {
        StrictQuota {
            keeper: Some(keeper),
        }
    }

    pub(super) fn is_strict(&self) -> bool {
        self.keeper.is_some()
    }

    /// Keys (per window size) and buckets this node keeps strict-admission state for.
    pub(super) fn tracked(&self) -> usize {
        self.keeper.as_ref().map_or(0, |q| q.tracked())
    }

    /// Store calls made for strict admission so far.
    pub(super) fn round_trips(&self) -> u64 {
        self.keeper.as_ref().map_or(0, |q| q.round_trips())
    }

    /// The task that returns unused quota every `RETURN_EVERY` (250 ms) until `cancel`
    /// (none for a namespace without quota).
    pub(super) fn return_unused_task(
        &self,
        sync: &Arc<NamespaceSync>,
        cancel: &CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let quota = self.keeper.clone()?;
        let (sync, cancel) = (sync.clone(), cancel.clone());
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    biased;
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(RETURN_EVERY) => {
                        quota.return_unused(&sync, now(), false).await;
                    }
                }
            }
        }))
    }

    /// At shutdown: every unused quota back, in a few quick attempts (what still fails
    /// stays counted until its window ends, as for a node that is killed).
    pub(super) async fn return_all(&self, sync: &Arc<NamespaceSync>) {
        let Some(quota) = &self.keeper else {
            return;
        };
        for attempt in 1..=3 {
            if quota.return_unused(sync, now(), true).await {
                return;
            }
            warn!(
                namespace = sync.name(),
                attempt, "giving back unused quota failed"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl NamespaceSync {
    /// A namespace that admits strictly, from quota `keeper` holds: the run loop has it
    /// return unused quota as windows end and keys go idle, and at shutdown.
    pub fn with_quota(mut self, keeper: Arc<dyn QuotaKeeper>) -> Self {
        self.strict = StrictQuota::new(keeper);
        self
    }

    pub fn is_strict(&self) -> bool {
        self.strict.is_strict()
    }

    /// Keys (per window size) and buckets this node keeps strict-admission state for.
    pub fn tracked_keys(&self) -> usize {
        self.strict.tracked()
    }

    /// Store calls made for strict admission so far.
    pub fn reservations(&self) -> u64 {
        self.strict.round_trips()
    }
}
