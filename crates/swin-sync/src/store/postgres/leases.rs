//! Concurrency leases on PostgreSQL (see `store::leases`): an acquire takes a
//! transaction-scoped advisory lock on the key, so two acquires of one key never count
//! at once, then counts and writes in one statement (four round trips in all). A
//! release ends the lease and marks its end (`swin_lease_ends`) in one statement.

use swin_core::UnixMs;

use super::{commit_by, err, PostgresStore};
use crate::store::leases::{
    slots_to_end, Acquire, Acquired, LeaseStore, Released, LEASE_END_KEPT_MS,
};
use crate::StoreError;

impl LeaseStore for PostgresStore {
    async fn acquire(
        &self,
        namespace: &str,
        a: Acquire<'_>,
        not_after: UnixMs,
    ) -> Result<Acquired, StoreError> {
        if a.key.contains('\0') || a.lease.contains('\0') {
            return Err(StoreError::Protocol(
                "PostgreSQL cannot store a key holding U+0000".into(),
            ));
        }
        let mut tx = self.pool().begin().await.map_err(err)?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))")
            .bind(namespace)
            .bind(a.key)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        // after the lock, one statement: lapsed leases go (not this lease's own row,
        // which the upsert rewrites), the live ones are counted, and the lease is
        // written if it fits (a mark of its earlier end goes: it is live again). The
        // statement's snapshot is taken after the lock, so it
        // sees every acquire of the key that committed before it.
        let (in_flight, earliest, granted): (i64, Option<i64>, bool) = sqlx::query_as(
            "WITH gone AS (
                 DELETE FROM swin_leases
                 WHERE namespace = $1 AND key = $2 AND expires_at <= $3 AND lease <> $4
             ), live AS (
                 SELECT coalesce(sum(count), 0)::int8 AS n, min(expires_at) AS earliest
                 FROM swin_leases
                 WHERE namespace = $1 AND key = $2 AND lease <> $4 AND expires_at > $3
             ), written AS (
                 INSERT INTO swin_leases (namespace, key, lease, count, expires_at)
                 SELECT $1, $2, $4, $5, $6 FROM live WHERE live.n + $5 <= $7
                 ON CONFLICT (namespace, key, lease) DO UPDATE
                 SET count = EXCLUDED.count, expires_at = EXCLUDED.expires_at
                 RETURNING 1
             ), unmarked AS (
                 DELETE FROM swin_lease_ends
                 WHERE namespace = $1 AND key = $2 AND lease = $4
                   AND EXISTS (SELECT 1 FROM written)
             )
             SELECT n, earliest, EXISTS (SELECT 1 FROM written) FROM live",
        )
        .bind(namespace)
        .bind(a.key)
        .bind(a.now.0)
        .bind(a.lease)
        .bind(a.count as i32)
        .bind(a.expires_at.0)
        .bind(i64::try_from(a.limit).unwrap_or(i64::MAX))
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        let in_flight = u64::try_from(in_flight).unwrap_or(0);
        commit_by(tx, not_after).await?;
        Ok(crate::store::leases::acquired(
            in_flight, earliest, granted, &a,
        ))
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
        if key.contains('\0') || lease.contains('\0') {
            return Ok(Released::NotLive);
        }
        let mut tx = self.pool().begin().await.map_err(err)?;
        // one statement: the lease ends if live, its end marked with `op`; otherwise the
        // mark of an earlier end (the statement's snapshot: before this one's)
        let (gone, by): (bool, Option<String>) = sqlx::query_as(
            "WITH gone AS (
                 DELETE FROM swin_leases
                 WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4
                 RETURNING 1
             ), marked AS (
                 INSERT INTO swin_lease_ends (namespace, key, lease, op, expires_at)
                 SELECT $1, $2, $3, $5, $6 WHERE EXISTS (SELECT 1 FROM gone)
                 ON CONFLICT (namespace, key, lease) DO UPDATE
                 SET op = EXCLUDED.op, expires_at = EXCLUDED.expires_at
             )
             SELECT EXISTS (SELECT 1 FROM gone),
                    (SELECT op FROM swin_lease_ends
                     WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4)",
        )
        .bind(namespace)
        .bind(key)
        .bind(lease)
        .bind(now.0)
        .bind(op)
        .bind(now.0.saturating_add(LEASE_END_KEPT_MS))
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        commit_by(tx, not_after).await?;
        Ok(crate::store::leases::released(gone, by.as_deref(), op))
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
        if key.contains('\0') || prefix.contains('\0') {
            return Ok(0);
        }
        let mut tx = self.pool().begin().await.map_err(err)?;
        // the acquire's lock: the leases counted here are the ones it counts
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))")
            .bind(namespace)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let live: Vec<(String, i32)> = sqlx::query_as(
            "SELECT lease, count FROM swin_leases
             WHERE namespace = $1 AND key = $2 AND expires_at > $3
               AND left(lease, length($4)) = $4
             ORDER BY expires_at, lease",
        )
        .bind(namespace)
        .bind(key)
        .bind(now.0)
        .bind(prefix)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let live: Vec<(String, u32)> = live
            .into_iter()
            .map(|(l, c)| (l, u32::try_from(c).unwrap_or(0)))
            .collect();
        let (whole, part) = slots_to_end(&live, count);
        // by what the statements ended (a release by id may end one first)
        let ended: Vec<i32> = sqlx::query_scalar(
            "DELETE FROM swin_leases WHERE namespace = $1 AND key = $2 AND lease = ANY($3)
             RETURNING count",
        )
        .bind(namespace)
        .bind(key)
        .bind(&whole)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let mut freed: u32 = ended.iter().map(|c| u32::try_from(*c).unwrap_or(0)).sum();
        if let Some((lease, keep)) = part {
            // (a release by id, which takes no lock, may have ended it meanwhile)
            let kept = sqlx::query(
                "UPDATE swin_leases SET count = $4
                 WHERE namespace = $1 AND key = $2 AND lease = $3",
            )
            .bind(namespace)
            .bind(key)
            .bind(lease)
            .bind(keep as i32)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
            if kept > 0 {
                let had = live.iter().find(|(l, _)| l == lease).map_or(keep, |l| l.1);
                freed += had - keep;
            }
        }
        commit_by(tx, not_after).await?;
        Ok(freed)
    }

    async fn in_flight(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let slots: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(count), 0)::bigint FROM swin_leases
             WHERE namespace = $1 AND expires_at > $2",
        )
        .bind(namespace)
        .bind(now.0)
        .fetch_one(self.pool())
        .await
        .map_err(err)?;
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
        let mut tx = self.pool().begin().await.map_err(err)?;
        let renewed = sqlx::query(
            "UPDATE swin_leases SET expires_at = $5
             WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4",
        )
        .bind(namespace)
        .bind(key)
        .bind(lease)
        .bind(now.0)
        .bind(expires_at.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        commit_by(tx, not_after).await?;
        Ok(renewed > 0)
    }
}
