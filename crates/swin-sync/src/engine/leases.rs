//! Concurrency leases through a namespace's engine: its store, under its name, each call
//! bounded by its store timeout. A lease is one atomic step in the store whatever the
//! sync rate, so nothing here is queued or synced: a call that fails changed nothing the
//! caller was told of (an acquire that timed out may still have been granted; it lapses
//! by its ttl). A namespace without a store keeps its leases on the node.

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::{Acquire, Acquired};
use crate::StoreError;

impl NamespaceSync {
    /// Takes `acquire.count` slots of `acquire.key` if its live leases leave room.
    /// `None`: the namespace has no store (the node keeps its leases itself).
    pub async fn acquire_lease(
        &self,
        acquire: Acquire<'_>,
    ) -> Option<Result<Acquired, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.acquire(self.name(), acquire))
                .await,
        )
    }

    /// Ends up to `count` slots of `key`'s live leases whose ids begin with `prefix`,
    /// earliest lapse first; answers the slots ended. `None`: no store.
    pub async fn release_lease_slots(
        &self,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
    ) -> Option<Result<u32, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.release_slots(
                self.name(),
                key,
                prefix,
                count,
                now,
                self.deadline_within(self.answer_within()),
            ))
            .await,
        )
    }

    /// The slots of the namespace's live leases across the cluster, as the store counts
    /// them now. `None`: no store.
    pub async fn leases_in_flight(&self, now: UnixMs) -> Option<Result<u64, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.in_flight(self.name(), now))
                .await,
        )
    }

    /// Ends (`renew_to: None`) or renews a live lease; false when it is unknown,
    /// released or lapsed. `None`: no store.
    pub async fn end_or_renew_lease(
        &self,
        key: &str,
        lease: &str,
        now: UnixMs,
        renew_to: Option<UnixMs>,
    ) -> Option<Result<bool, StoreError>> {
        let store = self.session.store.as_ref()?;
        let (name, not_after) = (self.name(), self.deadline_within(self.answer_within()));
        Some(match renew_to {
            None => {
                self.call_for_request(store.release(name, key, lease, now, not_after))
                    .await
            }
            Some(to) => {
                self.call_for_request(store.renew(name, key, lease, to, now, not_after))
                    .await
            }
        })
    }
}
