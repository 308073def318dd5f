//! A local-only namespace's reservations of a cost, kept on this node as a store keeps
//! them (see `store::reservations`).

use std::collections::HashMap;
use std::sync::Mutex;

use swin_core::UnixMs;

use super::MemoryStore;
use crate::store::{
    extend_identity, Ended, OpenReservation, Opened, Opening, ReservationRecord, ReservationStore,
    ENDED_KEPT_MS, OPS_KEPT,
};
use crate::StoreError;

/// How many takes a local record keeps, about what [`MAX_COUNTED_TEXT`] holds.
///
/// [`MAX_COUNTED_TEXT`]: crate::store::MAX_COUNTED_TEXT
const MAX_COUNTED: usize = 90;

/// A local-only namespace's reservations, kept on this node as a store keeps them (an
/// ended one stays for [`ENDED_KEPT_MS`], each extend's operation id is kept): at most
/// `max` of them (the namespace's `max_counters`); lapsed ones are dropped when the table
/// or a cap is full. The calls' `namespace` and `not_after` are not read (nothing here
/// waits).
#[derive(Debug)]
pub(super) struct Reservations {
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

impl Reservations {
    /// A table of at most `max` open reservations.
    pub(super) fn new(max: usize) -> Self {
        Reservations {
            table: Mutex::default(),
            max: max.max(1),
        }
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ReservationStore for MemoryStore {
    async fn open_reservations(&self, _: &str, now: UnixMs) -> Result<u64, StoreError> {
        let t = self.reservations.table();
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
        let mut t = self.reservations.table();
        if let Some(l) = t.records.get(o.id).filter(|l| l.record.expires_at > o.now) {
            let mine = l.record.ended.is_none() && l.record.keys == o.keys;
            let opening = if mine { Opening::Open } else { Opening::Taken };
            return Ok(Opened::uncounted(opening));
        }
        if t.records.len() >= self.reservations.max || t.refused(&o).is_some() {
            t.drop_lapsed(o.now);
            if let Some(refused) = t.refused(&o) {
                return Ok(t.opened(&o, refused));
            }
            if t.records.len() >= self.reservations.max {
                return Err(StoreError::Full(format!(
                    "this node holds {} reservations, its most (max_counters); try again once some lapse (a committed one is kept two minutes for its retries)",
                    self.reservations.max
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
        let mut t = self.reservations.table();
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
        let mut t = self.reservations.table();
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
        let t = self.reservations.table();
        let l = t.records.get(id).filter(|l| l.record.expires_at > now);
        Ok(l.map(|l| l.record.clone()))
    }
}
