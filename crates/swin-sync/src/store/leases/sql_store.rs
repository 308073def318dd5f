//! The SQL stores' leases (PostgreSQL, SQLite): their statements, in one dialect, and
//! the implementation both share ([`sql_lease_store!`]).

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
/// next is the transaction's first write, and takes the store's write lock), `acquire`
/// (if the store can, one statement after the lock that does an acquire's purge, count,
/// write and unmark at once, bound as `$1` namespace, `$2` key, `$3` now, `$4` lease,
/// `$5` count, `$6` lapse, `$7` limit, answering the other live slots, their earliest
/// lapse and whether it was written), `slots_end` (ends the key's leases named in the
/// JSON array `$3`, answering each one's slots) and the statements of [`statements`] in
/// its placeholders. Each change is one transaction:
/// an acquire purges the key's lapsed leases, counts the live ones and writes its own if
/// it fits; a release ends the lease and marks its end, or reads the mark of an earlier
/// end.
macro_rules! sql_lease_store {
    (
        $store:ty,
        err: $err:path,
        commit_by: $commit_by:path,
        storable: $storable:path,
        lock: $lock:expr,
        acquire: $acquire:expr,
        slots_end: $slots_end:expr,
        sql: $sql:expr $(,)?
    ) => {
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
                    if let Some(acquire) = $acquire {
                        let (in_flight, earliest, granted): (i64, Option<i64>, bool) =
                            sqlx::query_as(acquire)
                                .bind(namespace)
                                .bind(a.key)
                                .bind(a.now.0)
                                .bind(a.lease)
                                .bind(i64::from(a.count))
                                .bind(a.expires_at.0)
                                .bind(i64::try_from(a.limit).unwrap_or(i64::MAX))
                                .fetch_one(&mut *tx)
                                .await
                                .map_err($err)?;
                        let in_flight = u64::try_from(in_flight).unwrap_or(0);
                        $commit_by(tx, not_after).await?;
                        return Ok(acquired(in_flight, earliest, granted, &a));
                    }
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
                    if !whole.is_empty() {
                        let leases = serde_json::to_string(&whole)
                            .map_err(|e| StoreError::Protocol(format!("leases as JSON: {e}")))?;
                        let ended: Vec<i64> = sqlx::query_scalar($slots_end)
                            .bind(namespace)
                            .bind(key)
                            .bind(leases)
                            .fetch_all(&mut *tx)
                            .await
                            .map_err($err)?;
                        freed = ended.iter().map(|c| u32::try_from(*c).unwrap_or(0)).sum();
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
