//! Concurrency leases: requests in flight per key, at most a limit of them across the
//! cluster. Every acquire, release and renewal is one atomic step in the store (whatever
//! the namespace's sync rate), so a slot released on one node can be taken on any other
//! at once and no interleaving of nodes passes the limit. A lease not released by its
//! lapse time no longer counts (a client or node that died frees its slots); the time is
//! the calling node's clock.
//!
//! Every change can be applied again without changing anything more, so that a node
//! that lost the store's reply sends it again and learns what the store did: an acquire
//! names its lease (sent again, it replaces itself), a renewal moves the lapse to a time
//! (sent again, to the same time), and a release carries an operation id and leaves a
//! mark (the lease's end: that id, kept [`LEASE_END_KEPT_MS`]), so that a release sent
//! again learns that the lease was ended, and whether by itself, instead of "not live".
//! Envoy's release of slots by key ([`LeaseStore::release_slots`]) ends slots by count,
//! not by lease: sent again, it would end as many slots more, so it is never sent again.
//!
//! Layout: PostgreSQL and SQLite, `swin_leases` (one row per lease; an acquire holds a
//! per-key lock — an advisory lock on PostgreSQL, the write lock on SQLite — while it
//! counts) and `swin_lease_ends` (a row per lease ended, until its mark lapses); Redis,
//! one hash per key (`swin:{<len>:<ns>:<key>}:leases`, lease → `count:lapse`) and a key
//! per lease ended (`swin:{<len>:<ns>:<key>}:lease-end:<lease>` → the release's
//! operation id, expiring by itself), changed by scripts.

use swin_core::UnixMs;

mod sql_store;

pub(crate) use self::sql_store::{sql_lease_store, statements, LeaseSql};

/// An acquire: `count` slots under `lease` until `expires_at`, if the key's live leases
/// leave room under `limit`.
#[derive(Debug, Clone, Copy)]
pub struct Acquire<'a> {
    pub key: &'a str,
    pub lease: &'a str,
    pub count: u32,
    pub limit: u64,
    pub expires_at: UnixMs,
    pub now: UnixMs,
}

/// What an acquire found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    pub granted: bool,
    /// Slots in flight after it (with its own when granted).
    pub in_flight: u64,
    /// The earliest lapse of a live lease of the key (`None`: none live): a denied
    /// client can expect a slot by then at the latest.
    pub earliest_lapse: Option<UnixMs>,
}

/// How long the end of a released lease is kept (at least), so that a release sent
/// again after a lost answer learns that the lease was released: two minutes.
pub const LEASE_END_KEPT_MS: i64 = 120_000;

/// What a release found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The lease was live and is ended by this release (now, or by an earlier attempt
    /// of the same operation whose reply was lost).
    Now,
    /// Another release ended it, less than [`LEASE_END_KEPT_MS`] ago (a client's
    /// release sent again after its answer was lost): nothing changed now.
    Before,
    /// Not live: never granted, lapsed, or released longer ago than that (nothing
    /// changed).
    NotLive,
}

store_calls! {
    /// The leases side of a store.
    pub trait LeaseStore kept in_memory {
        /// Takes the slots if the key's live leases leave room. Past `not_after` by the
        /// store's clock nothing changes ([`StoreError::TooLate`](crate::StoreError::TooLate):
        /// its caller stopped waiting), as for every change below. Sent again, the same
        /// lease replaces itself.
        fn acquire(&self, namespace: &str, acquire: Acquire<'_>, not_after: UnixMs) -> Acquired;

        /// Ends a live lease as the operation `op` (an operation id, see
        /// [`new_op`](crate::store::new_op)), marking its end for [`LEASE_END_KEPT_MS`]:
        /// [`Released::Now`] also when an earlier attempt of `op` ended it,
        /// [`Released::Before`] when another release did. Past `not_after` by the
        /// store's clock nothing changes.
        fn release(
            &self,
            namespace: &str,
            key: &str,
            lease: &str,
            op: &str,
            now: UnixMs,
            not_after: UnixMs,
        ) -> Released;

        /// Ends up to `count` slots of the key's live leases whose ids begin with `prefix`,
        /// the earliest to lapse first (a lease of more slots than are left to end gives up
        /// that many and keeps the rest): leases a door ends by key, not by id (Envoy's
        /// negative hits). Answers the slots ended. Not idempotent: an attempt whose reply
        /// was lost may have ended its slots, and sent again it would end as many more.
        fn release_slots(
            &self,
            namespace: &str,
            key: &str,
            prefix: &str,
            count: u32,
            now: UnixMs,
            not_after: UnixMs,
        ) -> u32;

        /// The slots of every live lease of the namespace, all keys: what is in flight
        /// across the cluster now (a gauge an operator reads; one aggregate on the SQL
        /// stores, a SCAN of the namespace's lease hashes on Redis).
        fn in_flight(&self, namespace: &str, now: UnixMs) -> u64;

        /// Moves a live lease's lapse to `expires_at`; false when it is not live (never
        /// granted, released, lapsed). Sent again it moves it to the same time.
        fn renew(
            &self,
            namespace: &str,
            key: &str,
            lease: &str,
            expires_at: UnixMs,
            now: UnixMs,
            not_after: UnixMs,
        ) -> bool;
    }
}

/// Which of `live` (lease, slots, in lapse order) [`LeaseStore::release_slots`] ends to free
/// `count` slots: the leases ended whole, and the last one's slots left, if it keeps some.
pub fn slots_to_end(live: &[(String, u32)], count: u32) -> (Vec<&str>, Option<(&str, u32)>) {
    let mut left = count;
    let mut whole = Vec::new();
    for (lease, slots) in live {
        if left == 0 {
            break;
        }
        if *slots <= left {
            whole.push(lease.as_str());
            left -= slots;
        } else {
            return (whole, Some((lease.as_str(), slots - left)));
        }
    }
    (whole, None)
}

/// The answer to an acquire (the SQL stores', and a node's own for local-only leases):
/// `in_flight` and `earliest` are the key's other live leases before it.
pub fn acquired(in_flight: u64, earliest: Option<i64>, granted: bool, a: &Acquire<'_>) -> Acquired {
    let earliest = earliest.map(UnixMs);
    Acquired {
        granted,
        in_flight: in_flight + if granted { u64::from(a.count) } else { 0 },
        earliest_lapse: match (earliest, granted) {
            (Some(e), true) => Some(e.min(a.expires_at)),
            (None, true) => Some(a.expires_at),
            (e, false) => e,
        },
    }
}

/// A release's answer from what the store found: whether it ended a live lease now, and
/// else the operation id marking an earlier end, if one is kept.
pub fn released(ended_now: bool, marked_by: Option<&str>, op: &str) -> Released {
    match (ended_now, marked_by) {
        (true, _) => Released::Now,
        (false, Some(by)) if by == op => Released::Now,
        (false, Some(_)) => Released::Before,
        (false, None) => Released::NotLive,
    }
}
