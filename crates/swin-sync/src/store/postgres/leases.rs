//! Concurrency leases on PostgreSQL (see `store::leases`): an acquire takes a
//! transaction-scoped advisory lock on the key, so two acquires of one key never count
//! at once.

use swin_core::UnixMs;

use super::{err, PostgresStore};
use crate::store::leases::{Acquire, Acquired, Leases};
use crate::StoreError;

impl Leases for PostgresStore {
    async fn acquire(&self, namespace: &str, a: Acquire<'_>) -> Result<Acquired, StoreError> {
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
        sqlx::query(
            "DELETE FROM swin_leases WHERE namespace = $1 AND key = $2 AND expires_at <= $3",
        )
        .bind(namespace)
        .bind(a.key)
        .bind(a.now.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let (in_flight, earliest): (i64, Option<i64>) = sqlx::query_as(
            "SELECT coalesce(sum(count), 0)::int8, min(expires_at) FROM swin_leases
             WHERE namespace = $1 AND key = $2 AND lease <> $3",
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
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (namespace, key, lease) DO UPDATE
                 SET count = EXCLUDED.count, expires_at = EXCLUDED.expires_at",
            )
            .bind(namespace)
            .bind(a.key)
            .bind(a.lease)
            .bind(a.count as i32)
            .bind(a.expires_at.0)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(crate::store::leases::acquired(
            in_flight, earliest, granted, &a,
        ))
    }

    async fn release(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        let gone = sqlx::query(
            "DELETE FROM swin_leases
             WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4",
        )
        .bind(namespace)
        .bind(key)
        .bind(lease)
        .bind(now.0)
        .execute(self.pool())
        .await
        .map_err(err)?
        .rows_affected();
        Ok(gone > 0)
    }

    async fn renew(
        &self,
        namespace: &str,
        key: &str,
        lease: &str,
        expires_at: UnixMs,
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        let renewed = sqlx::query(
            "UPDATE swin_leases SET expires_at = $5
             WHERE namespace = $1 AND key = $2 AND lease = $3 AND expires_at > $4",
        )
        .bind(namespace)
        .bind(key)
        .bind(lease)
        .bind(now.0)
        .bind(expires_at.0)
        .execute(self.pool())
        .await
        .map_err(err)?
        .rows_affected();
        Ok(renewed > 0)
    }
}
