//! Where a namespace's reservations of a cost are recorded ([`ReservationBook`]): through
//! its engine, in its store (every call one atomic step there, bounded by
//! `answer_timeout`, so that any node extends or settles a reservation, once), or, for a
//! local-only namespace, the node's memory ([`swin_sync::store::MemoryStore`], under the
//! same contract).

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::{OpenReservation, Opened, ReservationRecord};
use swin_sync::{NamespaceSync, StoreError};

use crate::error::Error;

/// A namespace's reservations, through its engine.
#[derive(Debug, Clone)]
pub struct ReservationBook(Arc<NamespaceSync>);

impl ReservationBook {
    /// The reservations of the namespace `sync` runs.
    pub fn for_namespace(sync: &Arc<NamespaceSync>) -> ReservationBook {
        ReservationBook(sync.clone())
    }

    /// How many of the namespace's reservations are open (across the cluster, for a
    /// store); the store's error as it is (a scrape logs it quietly).
    pub async fn open_count(&self, now: UnixMs) -> Result<u64, StoreError> {
        self.0.open_reservations(now).await
    }

    /// Records an open reservation unless a cap refuses it: what it did
    /// ([`Opening`](swin_sync::store::Opening); open also when an earlier attempt of this
    /// opening wrote it). The store is waited for at most `within`; its error as it is.
    pub async fn open(
        &self,
        o: OpenReservation<'_>,
        within: Duration,
    ) -> Result<Opened, StoreError> {
        self.0.open_reservation(o, within).await
    }

    /// Raises an open reservation's total by `more`, counted at `at`, as the operation
    /// `op`: its record after it (also when an earlier attempt of `op` was applied),
    /// `None` when it is not open. The store is waited for at most `within`; its error
    /// as it is (whether the change may have been applied is the caller's to resolve).
    pub async fn extend(
        &self,
        id: &str,
        op: &str,
        more: f64,
        at: UnixMs,
        within: Duration,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        self.0.extend_reservation(id, op, more, at, within).await
    }

    /// Ends an open reservation as the commit `op` at `cost`: its record, with the
    /// commit that ended it (`op` for exactly one operation, however often it asks);
    /// `None` when there is none. The store is waited for at most `within`; its error
    /// as it is.
    pub async fn take(
        &self,
        id: &str,
        op: &str,
        cost: f64,
        within: Duration,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        self.0.take_reservation(id, op, cost, within).await
    }

    /// A reservation's record, open or ended; `None` when there is none.
    pub async fn read(&self, id: &str, now: UnixMs) -> Result<Option<ReservationRecord>, Error> {
        let read = self.0.read_reservation(id, now).await;
        read.map_err(|e| Error::store(&e, "reading a reservation"))
    }
}
