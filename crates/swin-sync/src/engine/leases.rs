//! Concurrency leases through a namespace's engine: its store, under its name, each call
//! bounded by its store timeout. A lease is one atomic step in the store whatever the
//! sync rate, so nothing here is queued or synced: a call that fails changed nothing the
//! caller was told of (an acquire that timed out may still have been granted; it lapses
//! by its ttl). A namespace without a store keeps its leases in the node's memory,
//! reached the same way ([`crate::store::MemoryStore`]).

use swin_core::UnixMs;

use super::NamespaceSync;
use std::time::Duration;

use crate::store::{Acquire, Acquired, Released};
use crate::StoreError;

impl NamespaceSync {
    /// Takes `acquire.count` slots of `acquire.key` if its live leases leave room.
    /// The caller waits at most `within`.
    pub async fn acquire_lease(
        &self,
        acquire: Acquire<'_>,
        within: Duration,
    ) -> Result<Acquired, StoreError> {
        let store = self.records();
        let not_after = self.deadline_within(within);
        let call = store.acquire(self.name(), acquire, not_after);
        self.lease_call(within, call).await
    }

    /// A lease call its caller waits for at most `within` (and the store timeout); a
    /// timeout trips the breaker, as a request's store call does.
    async fn lease_call<T>(
        &self,
        within: Duration,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let r = self.call_within(within, f).await;
        if let Err(e @ StoreError::Timeout(_)) = &r {
            self.trip(e);
        }
        r
    }

    /// Ends up to `count` slots of `key`'s live leases whose ids begin with `prefix`,
    /// earliest lapse first; answers the slots ended.
    pub async fn release_lease_slots(
        &self,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
    ) -> Result<u32, StoreError> {
        let store = self.records();
        self.call_for_request(store.release_slots(
            self.name(),
            key,
            prefix,
            count,
            now,
            self.deadline_within(self.answer_within()),
        ))
        .await
    }

    /// The slots of the namespace's live leases across the cluster, as the store counts
    /// them now.
    pub async fn leases_in_flight(&self, now: UnixMs) -> Result<u64, StoreError> {
        let store = self.records();
        self.call_for_request(store.in_flight(self.name(), now))
            .await
    }

    /// Ends a live lease as the operation `op` (see
    /// [`crate::store::LeaseStore::release`]). The caller waits at most `within`.
    pub async fn release_lease(
        &self,
        key: &str,
        lease: &str,
        op: &str,
        now: UnixMs,
        within: Duration,
    ) -> Result<Released, StoreError> {
        let store = self.records();
        let (name, not_after) = (self.name(), self.deadline_within(within));
        let call = store.release(name, key, lease, op, now, not_after);
        self.lease_call(within, call).await
    }

    /// Moves a live lease's lapse to `to`; false when it is not live. The caller waits at
    /// most `within`.
    pub async fn renew_lease(
        &self,
        key: &str,
        lease: &str,
        to: UnixMs,
        now: UnixMs,
        within: Duration,
    ) -> Result<bool, StoreError> {
        let store = self.records();
        let (name, not_after) = (self.name(), self.deadline_within(within));
        let call = store.renew(name, key, lease, to, now, not_after);
        self.lease_call(within, call).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use swin_core::{CounterOptions, NamespaceCounters, UnixMs, WindowSize};

    use crate::engine::{NamespaceSync, SyncMode};
    use crate::store::Acquire;

    fn local(name: &str) -> NamespaceSync {
        let size = WindowSize::new(60).expect("size");
        let counters = NamespaceCounters::new(name, &[size], CounterOptions::default());
        NamespaceSync::new(
            Arc::new(counters),
            SyncMode::LocalOnly,
            None,
            "n1".into(),
            Duration::from_secs(1),
        )
    }

    /// A rebuilt local-only namespace keeps the leases of the one it replaces, also
    /// those the old one takes after the rebuild and before it is retired — when it had
    /// taken none before (its table made then, not at first use by each apart).
    #[tokio::test]
    async fn a_rebuilt_namespace_keeps_what_the_old_one_takes_until_retired() {
        let (old, new) = (local("api"), local("api"));
        new.keep_records_of(&old);
        let now = UnixMs(1_700_000_000_000);
        let a = Acquire {
            key: "k",
            lease: "l1",
            count: 1,
            limit: 1,
            expires_at: UnixMs(now.0 + 60_000),
            now,
        };
        let within = Duration::from_millis(100);
        assert!(old.acquire_lease(a, within).await.expect("acquire").granted);
        assert_eq!(new.leases_in_flight(now).await.expect("in flight"), 1);
        let b = Acquire { lease: "l2", ..a };
        let refused = new.acquire_lease(b, within).await.expect("acquire");
        assert!(
            !refused.granted,
            "the limit's one slot is the old one's lease"
        );
    }
}
