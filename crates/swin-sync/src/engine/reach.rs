//! Reaching the store: the ping that tells a namespace's readiness and measures the
//! node's clock against the store's ([`crate::clock`]), and the warm-up that loads a
//! namespace's totals (in the background: the node serves meanwhile).

use swin_core::UnixMs;

use super::{nanos, now, off_runtime, Create, NamespaceSync};
use crate::StoreError;

impl NamespaceSync {
    /// Whether the namespace's totals are still loading from the store.
    pub fn warming(&self) -> bool {
        self.session.warming()
    }

    pub fn set_warming(&self, on: bool) {
        self.session.set_warming(on);
    }

    /// Pings the store: the namespace has reached it (its readiness counts from now), and
    /// the node's clock is measured against the store's.
    pub async fn reach(&self) -> Result<(), StoreError> {
        let Some(store) = &self.session.store else {
            return Ok(());
        };
        let sent = crate::clock::system_now();
        if let Some(store_time) = self.call(store.ping()).await? {
            crate::clock::clock().observe(store_time, sent, crate::clock::system_now());
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_success_ms = Some(now().0);
        Ok(())
    }

    /// Measures the node's clock against the store's, when a measurement is due (once a
    /// second for the whole node: see [`crate::clock`]). A store that does not answer
    /// leaves the offset as it was.
    pub async fn measure_clock(&self) {
        let Some(store) = &self.session.store else {
            return;
        };
        if !crate::clock::clock().due() {
            return;
        }
        let sent = crate::clock::system_now();
        if let Ok(Some(store_time)) = self.call(store.ping()).await {
            let received = crate::clock::system_now();
            crate::clock::clock().observe(store_time, sent, received);
        }
    }

    /// Loads the namespace's current and previous windows from the store (a node that
    /// starts knows the cluster's totals before its first sync).
    pub async fn warm_up(&self, now: UnixMs) -> Result<usize, StoreError> {
        self.load_totals(now, Create::Yes).await
    }

    /// Loads the namespace's current and previous windows into the keys it does not hold:
    /// for a namespace whose engine runs already (one rebuilt by a reload), which keeps
    /// the keys it holds current itself — a load read before its last sync must not set
    /// them back.
    pub async fn fill(&self, now: UnixMs) -> Result<usize, StoreError> {
        self.load_totals(now, Create::Absent).await
    }

    async fn load_totals(&self, now: UnixMs, create: Create) -> Result<usize, StoreError> {
        let Some(store) = &self.session.store else {
            return Ok(0);
        };
        let windows: Vec<(u32, i64)> = self
            .counters
            .window_sizes()
            .map(|s| (s.secs(), s.previous_start_of(now)))
            .collect();
        let since = self.fresh.since();
        let totals = self
            .call(store.load_namespace(self.name(), &windows))
            .await?;
        let (counters, fresh, mut loaded) =
            (self.counters.clone(), self.fresh.clone(), totals.len());
        // keys counted through the store meanwhile keep their newer counts
        off_runtime(move || fresh.apply_unless_newer(&counters, totals, now, since, create))
            .await?;
        if self.buckets {
            let tats = self.call(store.load_tats(self.name(), nanos(now))).await?;
            loaded += tats.len();
            let counters = self.counters.clone();
            off_runtime(move || counters.buckets().apply(&tats, true)).await?;
        }
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .last_success_ms = Some(now.0);
        Ok(loaded)
    }
}
