//! Where a namespace's reservations of a cost are recorded ([`ReservationBook`]): its
//! store (every call one atomic step there, bounded by `answer_timeout`, so that any
//! node extends or settles a reservation, once), or, for a local-only namespace, this
//! node's memory ([`LocalReservations`], a memory backend of the same
//! [`ReservationStore`] interface).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::{
    extend_identity, Ended, OpenReservation, Opened, Opening, ReservationRecord, ReservationStore,
    ENDED_KEPT_MS, OPS_KEPT,
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
/// or a cap is full. The calls' `namespace` and `not_after` are not read (nothing here
/// waits).
#[derive(Debug)]
pub struct LocalReservations {
    table: Mutex<Table>,
    max: usize,
}

/// The records, and how many of them are open (not ended; lapsed ones until dropped),
/// in all and per client.
#[derive(Debug, Default)]
struct Table {
    records: HashMap<String, Local>,
    open: u64,
    by_client: HashMap<String, u64>,
}

/// One record (with the operation ids of its latest extends) and the client it is
/// counted for.
#[derive(Debug)]
struct Local {
    record: ReservationRecord,
    client: String,
}

impl Table {
    /// `l` no longer counted as open (ended, or dropped while open).
    fn uncount(&mut self, client: &str) {
        self.open = self.open.saturating_sub(1);
        if let Some(n) = self.by_client.get_mut(client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_client.remove(client);
            }
        }
    }

    /// Drops the records lapsed by `now`, and their counts.
    fn drop_lapsed(&mut self, now: UnixMs) {
        let lapsed: Vec<String> = self
            .records
            .iter()
            .filter(|(_, l)| l.record.expires_at <= now)
            .map(|(id, _)| id.clone())
            .collect();
        for id in lapsed {
            if let Some(l) = self.records.remove(&id) {
                if l.record.ended.is_none() {
                    self.uncount(&l.client);
                }
            }
        }
    }

    /// Which cap an opening by `client` would pass, if any.
    fn refused(&self, o: &OpenReservation<'_>) -> Option<Opening> {
        let mine = self.by_client.get(o.client).copied().unwrap_or(0);
        let reached = |n: u64, cap: Option<u64>| cap.is_some_and(|c| n >= c);
        if reached(self.open, o.max_open) {
            Some(Opening::Full)
        } else if !o.client.is_empty() && reached(mine, o.max_open_per_client) {
            Some(Opening::ClientFull)
        } else {
            None
        }
    }

    /// What an opening `o` did, with the counts before it.
    fn opened(&self, o: &OpenReservation<'_>, opening: Opening) -> Opened {
        let mine = self.by_client.get(o.client).copied().unwrap_or(0);
        let open = self.open - u64::from(opening == Opening::Open);
        let client_open = mine.saturating_sub(u64::from(opening == Opening::Open));
        Opened {
            opening,
            open: Some(open),
            client_open: (!o.client.is_empty()).then_some(client_open),
        }
    }
}

impl LocalReservations {
    /// A table of at most `max` open reservations.
    pub fn new(max: usize) -> Self {
        LocalReservations {
            table: Mutex::default(),
            max: max.max(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ReservationStore for LocalReservations {
    async fn open_reservations(&self, _: &str, now: UnixMs) -> Result<u64, StoreError> {
        let t = self.table();
        let open = t.records.values().map(|l| &l.record);
        Ok(open
            .filter(|r| r.expires_at > now && r.ended.is_none())
            .count() as u64)
    }

    async fn open_reservation(
        &self,
        _: &str,
        o: OpenReservation<'_>,
    ) -> Result<Opened, StoreError> {
        let mut t = self.table();
        if let Some(l) = t.records.get(o.id).filter(|l| l.record.expires_at > o.now) {
            let mine = l.record.ended.is_none() && l.record.keys == o.keys;
            let opening = if mine { Opening::Open } else { Opening::Taken };
            return Ok(Opened::uncounted(opening));
        }
        if t.records.len() >= self.max || t.refused(&o).is_some() {
            t.drop_lapsed(o.now);
            if let Some(refused) = t.refused(&o) {
                return Ok(t.opened(&o, refused));
            }
            if t.records.len() >= self.max {
                return Err(StoreError::Unavailable(format!(
                    "this node holds {} open reservations, its most (max_counters); try again once some are committed or lapse",
                    self.max
                )));
            }
        }
        if let Some(old) = t.records.remove(o.id) {
            // lapsed: no longer open
            if old.record.ended.is_none() {
                t.uncount(&old.client);
            }
        }
        let record = ReservationRecord {
            keys: o.keys.to_vec(),
            total: o.total,
            expires_at: o.expires_at,
            counted: vec![(o.at, o.total)],
            ended: None,
            extends: Vec::new(),
        };
        t.open += 1;
        *t.by_client.entry(o.client.to_owned()).or_default() += 1;
        t.records.insert(
            o.id.to_owned(),
            Local {
                record,
                client: o.client.to_owned(),
            },
        );
        Ok(t.opened(&o, Opening::Open))
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
        let Some(l) = t.records.get_mut(id).filter(|l| l.record.expires_at > now) else {
            return Ok(None);
        };
        let Some(identity) = extend_identity(op) else {
            return Err(StoreError::Protocol(format!(
                "{op:?} is not an extend's operation id"
            )));
        };
        if l.record.applied_by(identity).is_some() {
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
        if l.record.extends.len() >= OPS_KEPT {
            l.record.extends.remove(0);
        }
        l.record.extends.push(op.to_owned());
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
        let Some(l) = t.records.get_mut(id).filter(|l| l.record.expires_at > now) else {
            return Ok(None);
        };
        let mut ended_now = None;
        if l.record.ended.is_none() {
            l.record.ended = Some(Ended {
                op: op.to_owned(),
                cost,
            });
            let kept = UnixMs(now.0.saturating_add(ENDED_KEPT_MS));
            l.record.expires_at = l.record.expires_at.max(kept);
            ended_now = Some(l.client.clone());
        }
        let record = l.record.clone();
        if let Some(client) = ended_now {
            t.uncount(&client);
        }
        Ok(Some(record))
    }

    async fn read_reservation(
        &self,
        _: &str,
        id: &str,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let t = self.table();
        let l = t.records.get(id).filter(|l| l.record.expires_at > now);
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

    /// Records an open reservation unless a cap refuses it: what it did ([`Opening`];
    /// open also when an earlier attempt of this opening wrote it). The store is waited
    /// for at most `within`; its error as it is.
    pub async fn open(
        &self,
        o: OpenReservation<'_>,
        within: Duration,
    ) -> Result<Opened, StoreError> {
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
