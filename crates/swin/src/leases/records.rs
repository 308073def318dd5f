//! Where a namespace's reservations of a cost are recorded ([`ReservationBook`]): its
//! store (every call one atomic step there, bounded by `answer_timeout`, so that any
//! node extends or settles a reservation, once), or, for a local-only namespace, this
//! node's memory ([`LocalReservations`], a memory backend of the same
//! [`ReservationStore`] interface).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use swin_core::UnixMs;
use swin_sync::store::{OpenReservation, ReservationRecord, ReservationStore};
use swin_sync::{NamespaceSync, StoreError};

use crate::error::Error;

/// How many takes a local record keeps, about what [`MAX_COUNTED_TEXT`] holds.
///
/// [`MAX_COUNTED_TEXT`]: swin_sync::store::MAX_COUNTED_TEXT
const MAX_COUNTED: usize = 90;

/// A local-only namespace's open reservations, kept on this node: at most `max` of
/// them (the namespace's `max_counters`); lapsed ones are dropped when the table is
/// full. The calls' `namespace` and `not_after` are not read (nothing here waits).
#[derive(Debug)]
pub struct LocalReservations {
    open: Mutex<HashMap<String, ReservationRecord>>,
    max: usize,
}

impl LocalReservations {
    /// A table of at most `max` open reservations.
    pub fn new(max: usize) -> Self {
        LocalReservations {
            open: Mutex::default(),
            max: max.max(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, ReservationRecord>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ReservationStore for LocalReservations {
    async fn open_reservations(&self, _: &str, now: UnixMs) -> Result<u64, StoreError> {
        Ok(self.table().values().filter(|r| r.expires_at > now).count() as u64)
    }

    async fn open_reservation(&self, _: &str, o: OpenReservation<'_>) -> Result<bool, StoreError> {
        let mut t = self.table();
        if t.get(o.id).is_some_and(|r| r.expires_at > o.now) {
            return Ok(false);
        }
        if t.len() >= self.max {
            t.retain(|_, r| r.expires_at > o.now);
            if t.len() >= self.max {
                return Err(StoreError::Unavailable(format!(
                    "this node holds {} open reservations, its most (max_counters); try again once some are committed or lapse",
                    self.max
                )));
            }
        }
        t.insert(
            o.id.to_owned(),
            ReservationRecord {
                keys: o.keys.to_vec(),
                total: o.total,
                expires_at: o.expires_at,
                counted: vec![(o.at, o.total)],
            },
        );
        Ok(true)
    }

    async fn extend_reservation(
        &self,
        _: &str,
        id: &str,
        more: f64,
        at: UnixMs,
        now: UnixMs,
        _: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let mut t = self.table();
        Ok(t.get_mut(id).filter(|r| r.expires_at > now).map(|r| {
            r.total += more;
            // as the stores keep it: at most MAX_COUNTED_TEXT's worth of takes
            if r.counted.len() < MAX_COUNTED {
                r.counted.push((at, more));
            }
            r.clone()
        }))
    }

    async fn take_reservation(
        &self,
        _: &str,
        id: &str,
        now: UnixMs,
        _: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        Ok(self.table().remove(id).filter(|r| r.expires_at > now))
    }

    async fn read_reservation(
        &self,
        _: &str,
        id: &str,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        Ok(self.table().get(id).filter(|r| r.expires_at > now).cloned())
    }
}

/// A namespace's reservations: its store's, or this node's.
#[derive(Debug, Clone)]
pub enum ReservationBook {
    /// Kept in the namespace's store, through its engine.
    Store(Arc<NamespaceSync>),
    /// Kept on this node (a local-only namespace).
    Local(Arc<LocalReservations>),
}

impl ReservationBook {
    /// The store of `sync` when it has one, else a table on this node of at most `max`
    /// open reservations.
    pub fn for_namespace(sync: &Arc<NamespaceSync>, max: usize) -> ReservationBook {
        match sync.store() {
            Some(_) => ReservationBook::Store(sync.clone()),
            None => ReservationBook::Local(Arc::new(LocalReservations::new(max))),
        }
    }

    /// Keeps the reservations of `old` where both are this node's (a rebuilt local-only
    /// namespace); a store keeps its own.
    pub fn carry_from(&mut self, old: &ReservationBook) {
        if let (ReservationBook::Local(new), ReservationBook::Local(old)) = (self, old) {
            *new = old.clone();
        }
    }

    /// How many of the namespace's reservations are open (across the cluster, for a
    /// store); the store's error as it is (a scrape logs it quietly).
    pub async fn open_count(&self, now: UnixMs) -> Result<u64, StoreError> {
        match self {
            ReservationBook::Store(sync) => sync.open_reservations(now).await.unwrap_or(Ok(0)),
            ReservationBook::Local(l) => l.open_reservations("", now).await,
        }
    }

    /// Records an open reservation; false when a live one holds its id.
    pub async fn open(&self, o: OpenReservation<'_>) -> Result<bool, Error> {
        const WHAT: &str = "recording a reservation";
        match self {
            ReservationBook::Store(sync) => stored(sync.open_reservation(o).await, WHAT),
            ReservationBook::Local(l) => local(l.open_reservation("", o).await),
        }
    }

    /// Raises an open reservation's total by `more`, counted at `at`: its record after
    /// it, `None` when it is not open.
    pub async fn extend(
        &self,
        id: &str,
        more: f64,
        at: UnixMs,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, Error> {
        const WHAT: &str = "extending a reservation";
        match self {
            ReservationBook::Store(sync) => {
                stored(sync.extend_reservation(id, more, at, now).await, WHAT)
            }
            ReservationBook::Local(l) => {
                local(l.extend_reservation("", id, more, at, now, now).await)
            }
        }
    }

    /// Ends an open reservation and answers its record: exactly one caller gets it.
    pub async fn take(&self, id: &str, now: UnixMs) -> Result<Option<ReservationRecord>, Error> {
        const WHAT: &str = "committing a reservation";
        match self {
            ReservationBook::Store(sync) => stored(sync.take_reservation(id, now).await, WHAT),
            ReservationBook::Local(l) => local(l.take_reservation("", id, now, now).await),
        }
    }

    /// An open reservation's record; `None` when it is not open.
    pub async fn read(&self, id: &str, now: UnixMs) -> Result<Option<ReservationRecord>, Error> {
        const WHAT: &str = "reading a reservation";
        match self {
            ReservationBook::Store(sync) => stored(sync.read_reservation(id, now).await, WHAT),
            ReservationBook::Local(l) => local(l.read_reservation("", id, now).await),
        }
    }
}

/// A store call's answer as a request's: `None` (no store) never comes from a book
/// built with one.
fn stored<T>(r: Option<Result<T, StoreError>>, what: &str) -> Result<T, Error> {
    match r {
        Some(r) => r.map_err(|e| Error::store(&e, what)),
        None => {
            tracing::error!("{what}: a store-kept reservation book without a store");
            Err(Error::Internal)
        }
    }
}

/// A call on this node's reservations as a request's answer: the one failure it has is
/// a full table (a 503, try again later).
fn local<T>(r: Result<T, StoreError>) -> Result<T, Error> {
    r.map_err(|e| match e {
        StoreError::Unavailable(m) => Error::Unavailable(m),
        e => Error::store(&e, "reservations kept on this node"),
    })
}
