//! A store wrapper that fails on demand (the `faults` feature, which only tests enable),
//! to test that the engine keeps and retries what it could not push. Every call of the
//! boundary honours the faults: fail before the inner store sees the call, or after it
//! ran (the reply lost: for a push, the hard case for exactly-once).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use swin_core::{CompactString, Tat, Total, UnixMs};

use super::{
    Capabilities, CounterStore, Grant, Granted, Held, Hold, Push, Pushed, QuotaStore, Store,
    StoreKind, TatPush, WindowKey,
};
use crate::StoreError;

/// What the next call does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Fail without calling the inner store.
    FailBefore,
    /// Call the inner store, then report a failure as if the reply was lost.
    FailAfter,
    /// Call the inner store and answer after this long (a slow store or link).
    Slow(std::time::Duration),
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Store,
    plan: Mutex<VecDeque<Fault>>,
    down: AtomicBool,
    /// While set, every call waits for ever (a store that accepts and never answers).
    hanging: AtomicBool,
}

impl FaultyStore {
    pub fn new(inner: Store) -> Self {
        FaultyStore {
            inner,
            plan: Mutex::new(VecDeque::new()),
            down: AtomicBool::new(false),
            hanging: AtomicBool::new(false),
        }
    }

    pub fn inner(&self) -> &Store {
        &self.inner
    }

    /// Queues faults for the next calls, one per call, whatever the call.
    pub fn plan(&self, faults: impl IntoIterator<Item = Fault>) {
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(faults);
    }

    /// Drops the faults still queued.
    pub fn clear_plan(&self) {
        self.plan.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// While down, every call fails before reaching the inner store.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// While hanging, every call waits for ever (the caller's timeout ends it).
    pub fn set_hanging(&self, hanging: bool) {
        self.hanging.store(hanging, Ordering::SeqCst);
    }

    fn next_fault(&self) -> Option<Fault> {
        if self.down.load(Ordering::SeqCst) {
            return Some(Fault::FailBefore);
        }
        self.plan
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Runs `call` on the inner store as the next fault says.
    async fn faulted<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if self.hanging.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        match self.next_fault() {
            Some(Fault::FailBefore) => Err(StoreError::Injected),
            Some(Fault::FailAfter) => {
                call.await?;
                Err(StoreError::Injected)
            }
            Some(Fault::Slow(d)) => {
                let answer = call.await;
                tokio::time::sleep(d).await;
                answer
            }
            None => call.await,
        }
    }
}

impl CounterStore for FaultyStore {
    fn kind(&self) -> StoreKind {
        self.inner.kind()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.faulted(self.inner.migrate()).await
    }

    async fn push(&self, namespace: &str, push: Push<'_>) -> Result<Pushed, StoreError> {
        self.faulted(self.inner.push(namespace, push)).await
    }

    async fn read(&self, namespace: &str, keys: &[WindowKey]) -> Result<Vec<Total>, StoreError> {
        self.faulted(self.inner.read(namespace, keys)).await
    }

    async fn load_namespace(
        &self,
        namespace: &str,
        windows: &[(u32, i64)],
    ) -> Result<Vec<Total>, StoreError> {
        self.faulted(self.inner.load_namespace(namespace, windows))
            .await
    }

    async fn purge(&self, now: UnixMs) -> Result<u64, StoreError> {
        self.faulted(self.inner.purge(now)).await
    }

    async fn push_tats(&self, namespace: &str, push: TatPush<'_>) -> Result<Vec<Tat>, StoreError> {
        self.faulted(self.inner.push_tats(namespace, push)).await
    }

    async fn read_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> Result<Vec<Tat>, StoreError> {
        self.faulted(self.inner.read_tats(namespace, keys)).await
    }

    async fn load_tats(&self, namespace: &str, now_ns: i64) -> Result<Vec<Tat>, StoreError> {
        self.faulted(self.inner.load_tats(namespace, now_ns)).await
    }

    async fn reset(
        &self,
        namespace: &str,
        key: &str,
        window_sizes: &[u32],
    ) -> Result<(), StoreError> {
        self.faulted(self.inner.reset(namespace, key, window_sizes))
            .await
    }

    async fn ping(&self) -> Result<Option<UnixMs>, StoreError> {
        self.faulted(self.inner.ping()).await
    }
}

impl QuotaStore for FaultyStore {
    async fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> Result<Vec<Held>, StoreError> {
        self.faulted(self.inner.hold(namespace, holder, holds))
            .await
    }

    async fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, StoreError> {
        self.faulted(self.inner.grant(namespace, holder, grants))
            .await
    }
}

impl super::DemandStore for FaultyStore {
    async fn post_demands(
        &self,
        namespace: &str,
        entries: &[super::Demands],
    ) -> Result<(), StoreError> {
        self.faulted(self.inner.post_demands(namespace, entries))
            .await
    }

    async fn read_demands(
        &self,
        namespace: &str,
        buckets: &[&str],
        now: UnixMs,
    ) -> Result<Vec<super::Demands>, StoreError> {
        self.faulted(self.inner.read_demands(namespace, buckets, now))
            .await
    }
}

impl super::LimitStore for FaultyStore {
    async fn put_limit(
        &self,
        namespace: &str,
        limit: &super::StoredLimit,
        not_after: UnixMs,
    ) -> Result<(), StoreError> {
        self.faulted(self.inner.put_limit(namespace, limit, not_after))
            .await
    }

    async fn delete_limit(
        &self,
        namespace: &str,
        key: &str,
        not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        self.faulted(self.inner.delete_limit(namespace, key, not_after))
            .await
    }

    async fn read_limits(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<Vec<super::StoredLimit>, StoreError> {
        self.faulted(self.inner.read_limits(namespace, keys)).await
    }

    async fn list_limits(
        &self,
        namespace: &str,
        after: Option<&str>,
        count: usize,
        now: UnixMs,
    ) -> Result<Vec<super::StoredLimit>, StoreError> {
        self.faulted(self.inner.list_limits(namespace, after, count, now))
            .await
    }

    async fn limit_changes(
        &self,
        namespace: &str,
        since: Option<&str>,
    ) -> Result<super::LimitChanges, StoreError> {
        self.faulted(self.inner.limit_changes(namespace, since))
            .await
    }
}

impl super::LeaseStore for FaultyStore {
    async fn acquire(
        &self,
        namespace: &str,
        acquire: super::Acquire<'_>,
    ) -> Result<super::Acquired, StoreError> {
        self.faulted(self.inner.acquire(namespace, acquire)).await
    }

    async fn release(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        self.faulted(
            self.inner
                .end_or_renew(namespace, key, lease, now, None, not_after),
        )
        .await
    }

    async fn release_slots(
        &self,
        namespace: &str,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<u32, StoreError> {
        self.faulted(
            self.inner
                .release_slots(namespace, key, prefix, count, now, not_after),
        )
        .await
    }

    async fn in_flight(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        self.faulted(self.inner.leases_in_flight(namespace, now))
            .await
    }

    async fn renew(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        expires_at: UnixMs,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        self.faulted(self.inner.end_or_renew(
            namespace,
            key,
            lease,
            now,
            Some(expires_at),
            not_after,
        ))
        .await
    }
}
