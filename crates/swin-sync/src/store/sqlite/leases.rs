//! Concurrency leases on SQLite (see `store::leases`): an acquire is one write
//! transaction whose first statement writes, so it holds the write lock while it counts.
//! A release ends the lease and marks its end (`swin_lease_ends`) in one transaction.

use swin_core::UnixMs;

use super::{commit_by, err, SqliteStore};
use crate::store::leases::{
    slots_to_end, Acquire, Acquired, LeaseStore, Released, LEASE_END_KEPT_MS,
};
use crate::StoreError;

impl LeaseStore for SqliteStore {
    async fn acquire(
        &self,
        namespace: &str,
        a: Acquire<'_>,
        not_after: UnixMs,
    ) -> Result<Acquired, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        sqlx::query(
            "DELETE FROM swin_leases WHERE namespace = ?1 AND key = ?2 AND expires_at <= ?3",
        )
        .bind(namespace)
        .bind(a.key)
        .bind(a.now.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let (in_flight, earliest): (i64, Option<i64>) = sqlx::query_as(
            "SELECT coalesce(sum(count), 0), min(expires_at) FROM swin_leases
             WHERE namespace = ?1 AND key = ?2 AND lease <> ?3",
        )
        .bind(namespace)
        .bind(a.key)
        .bind(a.lease)
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
        let in_flight = u64::try_from(in_flight).unwrap_or(0);
        let granted = in_flight + u64::from(a.count) <= a.limit;
        if granted {
            sqlx::query(
                "INSERT INTO swin_leases (namespace, key, lease, count, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (namespace, key, lease) DO UPDATE
                 SET count = excluded.count, expires_at = excluded.expires_at",
            )
            .bind(namespace)
            .bind(a.key)
            .bind(a.lease)
            .bind(i64::from(a.count))
            .bind(a.expires_at.0)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            // live again: a mark of its earlier end goes
            sqlx::query(
                "DELETE FROM swin_lease_ends WHERE namespace = ?1 AND key = ?2 AND lease = ?3",
            )
            .bind(namespace)
            .bind(a.key)
            .bind(a.lease)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
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
        let mut tx = self.pool().begin().await.map_err(err)?;
        let gone = sqlx::query(
            "DELETE FROM swin_leases
             WHERE namespace = ?1 AND key = ?2 AND lease = ?3 AND expires_at > ?4",
        )
        .bind(namespace)
        .bind(key)
        .bind(lease)
        .bind(now.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        let by: Option<String> = if gone > 0 {
            sqlx::query(
                "INSERT INTO swin_lease_ends (namespace, key, lease, op, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (namespace, key, lease) DO UPDATE
                 SET op = excluded.op, expires_at = excluded.expires_at",
            )
            .bind(namespace)
            .bind(key)
            .bind(lease)
            .bind(op)
            .bind(now.0.saturating_add(LEASE_END_KEPT_MS))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            None
        } else {
            sqlx::query_scalar(
                "SELECT op FROM swin_lease_ends
                 WHERE namespace = ?1 AND key = ?2 AND lease = ?3 AND expires_at > ?4",
            )
            .bind(namespace)
            .bind(key)
            .bind(lease)
            .bind(now.0)
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?
        };
        commit_by(tx, not_after).await?;
        Ok(crate::store::leases::released(gone > 0, by.as_deref(), op))
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
        // a write first: the transaction holds the write lock while it counts, as an
        // acquire's does
        let mut tx = self.pool().begin().await.map_err(err)?;
        sqlx::query(
            "DELETE FROM swin_leases WHERE namespace = ?1 AND key = ?2 AND expires_at <= ?3",
        )
        .bind(namespace)
        .bind(key)
        .bind(now.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let live: Vec<(String, i64)> = sqlx::query_as(
            "SELECT lease, count FROM swin_leases
             WHERE namespace = ?1 AND key = ?2 AND substr(lease, 1, length(?3)) = ?3
             ORDER BY expires_at, lease",
        )
        .bind(namespace)
        .bind(key)
        .bind(prefix)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let live: Vec<(String, u32)> = live
            .into_iter()
            .map(|(l, c)| (l, u32::try_from(c).unwrap_or(0)))
            .collect();
        let (whole, part) = slots_to_end(&live, count);
        // under the write lock nothing else changes them: every live slot up to `count`
        let live_slots: u64 = live.iter().map(|(_, c)| u64::from(*c)).sum();
        let freed = u32::try_from(live_slots.min(u64::from(count))).unwrap_or(count);
        for lease in whole {
            sqlx::query("DELETE FROM swin_leases WHERE namespace = ?1 AND key = ?2 AND lease = ?3")
                .bind(namespace)
                .bind(key)
                .bind(lease)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        if let Some((lease, keep)) = part {
            sqlx::query(
                "UPDATE swin_leases SET count = ?4 WHERE namespace = ?1 AND key = ?2 AND lease = ?3",
            )
            .bind(namespace)
            .bind(key)
            .bind(lease)
            .bind(i64::from(keep))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        commit_by(tx, not_after).await?;
        Ok(freed)
    }

    async fn in_flight(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let slots: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(count), 0) FROM swin_leases
             WHERE namespace = ?1 AND expires_at > ?2",
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
            "UPDATE swin_leases SET expires_at = ?5
             WHERE namespace = ?1 AND key = ?2 AND lease = ?3 AND expires_at > ?4",
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
