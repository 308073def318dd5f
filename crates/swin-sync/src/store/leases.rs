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
    pub trait LeaseStore {
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

/// The statements both SQL stores run, written in PostgreSQL's placeholders (`$n`), in
/// the functions of both dialects: [`statements`] gives them in a store's.
mod sql {
    /// The key's lapsed leases go.
    pub const PURGE: &str =
        "DELETE FROM swin_leases WHERE namespace = $1 AND key = $2 AND expires_at <= $3";
    /// The slots of the key's other live leases (not `$3`'s own), and their earliest lapse.
    pub const LIVE: &str = "SELECT coalesce(sum(count), 0), min(expires_at) FROM swin_leases
         WHERE namespace = $1 AND key = $2 AND lease <> $3 AND expires_at > $4";
    pub const WRITE: &str = "INSERT INTO swin_leases (namespace, key, lease, count, expires_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (namespace, key, lease) DO UPDATE
         SET count = excluded.count, expires_at = excluded.expires_at";
    /// A lease live again: the mark of its earlier end goes.
    pub const UNMARK: &str =
        "DELETE FROM swin_lease_ends WHERE namespace = $1 AND key = $2 AND lease = $3";
    pub const END: &str = "DELETE FROM swin_leases
         WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4";
    pub const MARK: &str = "INSERT INTO swin_lease_ends (namespace, key, lease, op, expires_at)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (namespace, key, lease) DO UPDATE
         SET op = excluded.op, expires_at = excluded.expires_at";
    pub const MARKED: &str = "SELECT op FROM swin_lease_ends
         WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4";
    /// The key's live leases whose ids begin with `$4`, earliest lapse first.
    pub const SLOTS: &str = "SELECT lease, CAST(count AS BIGINT) FROM swin_leases
         WHERE namespace = $1 AND key = $2 AND expires_at > $3
           AND substr(lease, 1, length($4)) = $4
         ORDER BY expires_at, lease";
    pub const SLOT_END: &str = "DELETE FROM swin_leases
         WHERE namespace = $1 AND key = $2 AND lease = $3 RETURNING CAST(count AS BIGINT)";
    pub const SLOT_KEEP: &str =
        "UPDATE swin_leases SET count = $4 WHERE namespace = $1 AND key = $2 AND lease = $3";
    pub const IN_FLIGHT: &str = "SELECT coalesce(sum(count), 0) FROM swin_leases
         WHERE namespace = $1 AND expires_at > $2";
    pub const RENEW: &str = "UPDATE swin_leases SET expires_at = $5
         WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4";
}

/// The statements of a SQL store's leases, in its placeholders.
#[derive(Debug)]
pub(crate) struct LeaseSql {
    pub purge: String,
    pub live: String,
    pub write: String,
    pub unmark: String,
    pub end: String,
    pub mark: String,
    pub marked: String,
    pub slots: String,
    pub slot_end: String,
    pub slot_keep: String,
    pub in_flight: String,
    pub renew: String,
}

/// The statements, each through `dialect` (PostgreSQL's: as they are).
pub(crate) fn statements(dialect: fn(&str) -> String) -> LeaseSql {
    LeaseSql {
        purge: dialect(sql::PURGE),
        live: dialect(sql::LIVE),
        write: dialect(sql::WRITE),
        unmark: dialect(sql::UNMARK),
        end: dialect(sql::END),
        mark: dialect(sql::MARK),
        marked: dialect(sql::MARKED),
        slots: dialect(sql::SLOTS),
        slot_end: dialect(sql::SLOT_END),
        slot_keep: dialect(sql::SLOT_KEEP),
        in_flight: dialect(sql::IN_FLIGHT),
        renew: dialect(sql::RENEW),
    }
}

/// Implements [`LeaseStore`] for a SQL store (PostgreSQL, SQLite) from its pieces: `err`
/// (its errors as [`StoreError`](crate::StoreError)s), `commit_by` (its commit unless
/// past `not_after`), `storable` (whether a text can be stored: a key or lease that
/// cannot be has no live lease, and is not acquired), `lock` (its statement, if it needs
/// one, that makes an acquire and a release of slots of one key wait for each other
/// until commit, bound to the namespace and the key: without one, the purge that comes
/// next is the transaction's first write, and takes the store's write lock) and the
/// statements of [`statements`] in its placeholders. Each change is one transaction:
/// an acquire purges the key's lapsed leases, counts the live ones and writes its own if
/// it fits; a release ends the lease and marks its end, or reads the mark of an earlier
/// end.
macro_rules! sql_lease_store {
    ($store:ty, err: $err:path, commit_by: $commit_by:path, storable: $storable:path, lock: $lock:expr, sql: $sql:expr $(,)?) => {
        // a block of its own, so that its imports stay out of the caller's module
        const _: () = {
            use swin_core::UnixMs;
            use $crate::store::leases::{
                acquired, released, slots_to_end, Acquire, Acquired, LeaseStore, Released,
                LEASE_END_KEPT_MS,
            };
            use $crate::StoreError;

            impl LeaseStore for $store {
                async fn acquire(
                    &self,
                    namespace: &str,
                    a: Acquire<'_>,
                    not_after: UnixMs,
                ) -> Result<Acquired, StoreError> {
                    if !($storable(a.key) && $storable(a.lease)) {
                        return Err(StoreError::Protocol(format!(
                            "this store cannot keep the key {:?} or the lease {:?} (U+0000)",
                            a.key, a.lease
                        )));
                    }
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    if let Some(lock) = $lock {
                        sqlx::query(lock)
                            .bind(namespace)
                            .bind(a.key)
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?;
                    }
                    // after the lock: every acquire of the key committed before is seen
                    sqlx::query(&$sql.purge)
                        .bind(namespace)
                        .bind(a.key)
                        .bind(a.now.0)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?;
                    let (in_flight, earliest): (i64, Option<i64>) = sqlx::query_as(&$sql.live)
                        .bind(namespace)
                        .bind(a.key)
                        .bind(a.lease)
                        .bind(a.now.0)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err($err)?;
                    let in_flight = u64::try_from(in_flight).unwrap_or(0);
                    let granted = in_flight + u64::from(a.count) <= a.limit;
                    if granted {
                        sqlx::query(&$sql.write)
                            .bind(namespace)
                            .bind(a.key)
                            .bind(a.lease)
                            .bind(i64::from(a.count))
                            .bind(a.expires_at.0)
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?;
                        sqlx::query(&$sql.unmark)
                            .bind(namespace)
                            .bind(a.key)
                            .bind(a.lease)
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?;
                    }
                    $commit_by(tx, not_after).await?;
                    Ok(acquired(in_flight, earliest, granted, &a))
                }

                async fn release(
                    &self,
                    namespace: &str,
                    key: &str,
                    lease: &str,
                    op: &str,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<Released, StoreError> {
                    if !($storable(key) && $storable(lease) && $storable(op)) {
                        return Ok(Released::NotLive);
                    }
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    let gone = sqlx::query(&$sql.end)
                        .bind(namespace)
                        .bind(key)
                        .bind(lease)
                        .bind(now.0)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?
                        .rows_affected();
                    let by: Option<String> = if gone > 0 {
                        sqlx::query(&$sql.mark)
                            .bind(namespace)
                            .bind(key)
                            .bind(lease)
                            .bind(op)
                            .bind(now.0.saturating_add(LEASE_END_KEPT_MS))
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?;
                        None
                    } else {
                        sqlx::query_scalar(&$sql.marked)
                            .bind(namespace)
                            .bind(key)
                            .bind(lease)
                            .bind(now.0)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err($err)?
                    };
                    $commit_by(tx, not_after).await?;
                    Ok(released(gone > 0, by.as_deref(), op))
                }

                async fn release_slots(
                    &self,
                    namespace: &str,
                    key: &str,
                    prefix: &str,
                    count: u32,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<u32, StoreError> {
                    if !($storable(key) && $storable(prefix)) {
                        return Ok(0);
                    }
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    // the acquire's lock: the leases counted here are the ones it counts
                    if let Some(lock) = $lock {
                        sqlx::query(lock)
                            .bind(namespace)
                            .bind(key)
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?;
                    }
                    sqlx::query(&$sql.purge)
                        .bind(namespace)
                        .bind(key)
                        .bind(now.0)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?;
                    let live: Vec<(String, i64)> = sqlx::query_as(&$sql.slots)
                        .bind(namespace)
                        .bind(key)
                        .bind(now.0)
                        .bind(prefix)
                        .fetch_all(&mut *tx)
                        .await
                        .map_err($err)?;
                    let live: Vec<(String, u32)> = live
                        .into_iter()
                        .map(|(l, c)| (l, u32::try_from(c).unwrap_or(0)))
                        .collect();
                    let (whole, part) = slots_to_end(&live, count);
                    // by what the statements ended (a release by id, which takes no
                    // lock, may end one first)
                    let mut freed: u32 = 0;
                    for lease in whole {
                        let ended: Option<i64> = sqlx::query_scalar(&$sql.slot_end)
                            .bind(namespace)
                            .bind(key)
                            .bind(lease)
                            .fetch_optional(&mut *tx)
                            .await
                            .map_err($err)?;
                        freed += ended.map_or(0, |c| u32::try_from(c).unwrap_or(0));
                    }
                    if let Some((lease, keep)) = part {
                        let kept = sqlx::query(&$sql.slot_keep)
                            .bind(namespace)
                            .bind(key)
                            .bind(lease)
                            .bind(i64::from(keep))
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?
                            .rows_affected();
                        if kept > 0 {
                            let had = live.iter().find(|(l, _)| l == lease).map_or(keep, |l| l.1);
                            freed += had - keep;
                        }
                    }
                    $commit_by(tx, not_after).await?;
                    Ok(freed)
                }

                async fn in_flight(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
                    let slots: i64 = sqlx::query_scalar(&$sql.in_flight)
                        .bind(namespace)
                        .bind(now.0)
                        .fetch_one(self.pool())
                        .await
                        .map_err($err)?;
                    Ok(u64::try_from(slots).unwrap_or(0))
                }

                async fn renew(
                    &self,
                    namespace: &str,
                    key: &str,
                    lease: &str,
                    expires_at: UnixMs,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<bool, StoreError> {
                    if !($storable(key) && $storable(lease)) {
                        return Ok(false);
                    }
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    let renewed = sqlx::query(&$sql.renew)
                        .bind(namespace)
                        .bind(key)
                        .bind(lease)
                        .bind(now.0)
                        .bind(expires_at.0)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?
                        .rows_affected();
                    $commit_by(tx, not_after).await?;
                    Ok(renewed > 0)
                }
            }
        };
    };
}

pub(crate) use sql_lease_store;
