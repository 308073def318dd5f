//! Reservations of a cost through a namespace's engine: its store, under its name, each
//! call bounded by its store timeout (a change also by the request's answer time: past
//! it the store changes nothing). `None`: the namespace has no store (the node keeps
//! its reservations itself).

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::{OpenReservation, ReservationRecord};
use crate::StoreError;

impl NamespaceSync {
    /// How many of the namespace's reservations are open across the cluster.
    pub async fn open_reservations(&self, now: UnixMs) -> Option<Result<u64, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.open_reservations(self.name(), now))
                .await,
        )
    }

    /// Records an open reservation; false when a live one holds its id.
    pub async fn open_reservation(
        &self,
        open: OpenReservation<'_>,
    ) -> Option<Result<bool, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.open_reservation(self.name(), open))
                .await,
        )
    }

    /// Raises an open reservation's total by `more`, counted at `at`: its record after
    /// it, `None` inside when it is not open.
    pub async fn extend_reservation(
        &self,
        id: &str,
        more: f64,
        at: UnixMs,
        now: UnixMs,
    ) -> Option<Result<Option<ReservationRecord>, StoreError>> {
        let store = self.session.store.as_ref()?;
        let not_after = self.deadline_within(self.answer_within());
        let extend = store.extend_reservation(self.name(), id, more, at, now, not_after);
        Some(self.call_for_request(extend).await)
    }

    /// Ends an open reservation, answering its record (exactly one caller gets it).
    pub async fn take_reservation(
        &self,
        id: &str,
        now: UnixMs,
    ) -> Option<Result<Option<ReservationRecord>, StoreError>> {
        let store = self.session.store.as_ref()?;
        let not_after = self.deadline_within(self.answer_within());
        Some(
            self.call_for_request(store.take_reservation(self.name(), id, now, not_after))
                .await,
        )
    }

    /// An open reservation's record, changing nothing.
    pub async fn read_reservation(
        &self,
        id: &str,
        now: UnixMs,
    ) -> Option<Result<Option<ReservationRecord>, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.read_reservation(self.name(), id, now))
                .await,
        )
    }
}
