//! Reservations of a cost through a namespace's engine: its store, under its name, each
//! call bounded by its store timeout (a change also by how long its caller waits,
//! `within`: past it the store changes nothing). A namespace without a store keeps them
//! in the node's memory, reached the same way ([`crate::store::MemoryStore`]).

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::{OpenReservation, Opened, ReservationRecord};
use crate::StoreError;

impl NamespaceSync {
    /// How many of the namespace's reservations are open across the cluster.
    pub async fn open_reservations(&self, now: UnixMs) -> Result<u64, StoreError> {
        let store = self.records();
        self.call_for_request(store.open_reservations(self.name(), now))
            .await
    }

    /// Records an open reservation unless a cap refuses it: what it did (open also when
    /// an earlier attempt wrote it). The caller waits at most `within`.
    pub async fn open_reservation(
        &self,
        open: OpenReservation<'_>,
        within: std::time::Duration,
    ) -> Result<Opened, StoreError> {
        let store = self.records();
        let opening = store.open_reservation(self.name(), open);
        self.call_within(within, opening).await
    }

    /// Raises an open reservation's total by `more`, counted at `at`, as the operation
    /// `op`: its record after it (also when an earlier attempt of `op` raised it),
    /// `None` inside when it is not open. The caller waits at most `within`.
    pub async fn extend_reservation(
        &self,
        id: &str,
        op: &str,
        more: f64,
        at: UnixMs,
        within: std::time::Duration,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let store = self.records();
        let not_after = self.deadline_within(within);
        let now = crate::now();
        let extend = store.extend_reservation(self.name(), id, op, more, at, now, not_after);
        self.call_within(within, extend).await
    }

    /// Ends an open reservation as the commit `op` at `cost`, answering its record with
    /// the commit that ended it (`op` for exactly one operation). The caller waits at
    /// most `within`.
    pub async fn take_reservation(
        &self,
        id: &str,
        op: &str,
        cost: f64,
        within: std::time::Duration,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let store = self.records();
        let not_after = self.deadline_within(within);
        let take = store.take_reservation(self.name(), id, op, cost, crate::now(), not_after);
        self.call_within(within, take).await
    }

    /// An open reservation's record, changing nothing.
    pub async fn read_reservation(
        &self,
        id: &str,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let store = self.records();
        self.call_for_request(store.read_reservation(self.name(), id, now))
            .await
    }
}
