//! Where a namespace's reservations of a cost are recorded ([`ReservationBook`]): its
//! store (every call one atomic step there, bounded by `answer_timeout`, so that any
//! node extends or settles a reservation, once), or, for a local-only namespace, this
//! node's memory ([`LocalReservations`], a memory backend of the same
//! [`ReservationStore`] interface).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::{
    Ended, OpenReservation, ReservationRecord, ReservationStore, ENDED_KEPT_MS, OPS_KEPT,
};
use swin_sync::{NamespaceSync, StoreError};

use crate::error::Error;

/// How many takes a local record keeps, about what [`MAX_COUNTED_TEXT`] holds.
///
/// [`MAX_COUNTED_TEXT`]: swin_sync::store::MAX_COUNTED_TEXT
const MAX_COUNTED: usize = 90;

/// A local-only namespace's reservations, kept on this node as a store keeps them (an
/// ended one stays for [`ENDED_KEPT_MS`], each extend's operation id is kept): at most
/// `max` of them (the namespace's `max_counters`); lapsed ones are dropped when the table
/// is full. The calls' `namespace` and `not_after` are not read (nothing here waits).
#[derive(Debug)]
pub struct LocalReservations {
    open: Mutex<HashMap<String, Local>>,
    max: usize,
}

/// One record and the operation ids of its latest extends.
#[derive(Debug)]
struct Local {
    record: ReservationRecord,
    ops: VecDeque<String>,
}

impl LocalReservations {
    /// A table of at most `max` open reservations.
    pub fn new(max: usize) -> Self {
        LocalReservations {
            open: Mutex::default(),
            max: max.max(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Local>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ReservationStore for LocalReservations {
    async fn open_reservations(&self, _: &str, now: UnixMs) -> Result<u64, StoreError> {
        let t = self.table();
        let open = t.values().map(|l| &l.record);
        Ok(open
            .filter(|r| r.expires_at > now && r.ended.is_none())
            .count() as u64)
    }

    async fn open_reservation(&self, _: &str, o: OpenReservation<'_>) -> Result<bool, StoreError> {
        let mut t = self.table();
        if let Some(l) = t.get(o.id).filter(|l| l.record.expires_at > o.now) {
            return Ok(l.record.ended.is_none() && l.record.keys == o.keys);
        }
        if t.len() >= self.max {
            t.retain(|_, l| l.record.expires_at > o.now);
            if t.len() >= self.max {
                return Err(StoreError::Unavailable(format!(
                    "this node holds {} open reservations, its most (max_counters); try again once some are committed or lapse",
                    self.max
                )));
            }
        }
        let record = ReservationRecord {
            keys: o.keys.to_vec(),
            total: o.total,
            expires_at: o.expires_at,
            counted: vec![(o.at, o.total)],
            ended: None,
        };
        t.insert(
            o.id.to_owned(),
            Local {
                record,
                ops: VecDeque::new(),
            },
        );
        Ok(true)
    }

    async fn extend_reservation(
        &self,
        _: &str,
        id: &str,
        op: &str,
        more: f64,
        at: UnixMs,
        now: UnixMs,
        _: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let mut t = self.table();
        let Some(l) = t.get_mut(id).filter(|l| l.record.expires_at > now) else {
            return Ok(None);
        };
        if l.ops.iter().any(|o| o == op) {
            return Ok(Some(l.record.clone()));
        }
        if l.record.ended.is_some() {
            return Ok(None);
        }
        l.record.total += more;
        // as the stores keep it: at most MAX_COUNTED_TEXT's worth of takes
        if l.record.counted.len() < MAX_COUNTED {
            l.record.counted.push((at, more));
        }
        if l.ops.len() >= OPS_KEPT {
            l.ops.pop_front();
        }
        l.ops.push_back(op.to_owned());
        Ok(Some(l.record.clone()))
    }

    async fn take_reservation(
        &self,
        _: &str,
        id: &str,
        op: &str,
        cost: f64,
        now: UnixMs,
        _: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let mut t = self.table();
        let Some(l) = t.get_mut(id).filter(|l| l.record.expires_at > now) else {
            return Ok(None);
        };
        if l.record.ended.is_none() {
            l.record.ended = Some(Ended {
                op: op.to_owned(),
                cost,
            });
            let kept = UnixMs(now.0.saturating_add(ENDED_KEPT_MS));
            l.record.expires_at = l.record.expires_at.max(kept);
        }
        Ok(Some(l.record.clone()))
    }

    async fn read_reservation(
        &self,
        _: &str,
        id: &str,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let t = self.table();
        let l = t.get(id).filter(|l| l.record.expires_at > now);
        Ok(l.map(|l| l.record.clone()))
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

    /// Records an open reservation: true when it is open after the call (also when an
    /// earlier attempt of this opening wrote it), false when another live one holds its
    /// id. The store is waited for at most `within`; its error as it is.
    pub async fn open(&self, o: OpenReservation<'_>, within: Duration) -> Result<bool, StoreError> {
        match self {
            ReservationBook::Store(sync) => no_store(sync.open_reservation(o, within).await),
            ReservationBook::Local(l) => l.open_reservation("", o).await,
        }
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
        match self {
            ReservationBook::Store(sync) => {
                no_store(sync.extend_reservation(id, op, more, at, within).await)
            }
            ReservationBook::Local(l) => {
                let now = swin_sync::now();
                l.extend_reservation("", id, op, more, at, now, now).await
            }
        }
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
        match self {
            ReservationBook::Store(sync) => {
                no_store(sync.take_reservation(id, op, cost, within).await)
            }
            ReservationBook::Local(l) => {
                let now = swin_sync::now();
                l.take_reservation("", id, op, cost, now, now).await
            }
        }
    }

    /// A reservation's record, open or ended; `None` when there is none.
    pub async fn read(&self, id: &str, now: UnixMs) -> Result<Option<ReservationRecord>, Error> {
        const WHAT: &str = "reading a reservation";
        match self {
            ReservationBook::Store(sync) => stored(sync.read_reservation(id, now).await, WHAT),
            ReservationBook::Local(l) => local(l.read_reservation("", id, now).await),
        }
    }
}

/// A store call made through a book built with a store (`None`, no store, never comes).
fn no_store<T>(r: Option<Result<T, StoreError>>) -> Result<T, StoreError> {
    r.unwrap_or_else(|| Err(StoreError::Unavailable("no store".into())))
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
