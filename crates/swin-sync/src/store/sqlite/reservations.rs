//! Reservations of a cost on SQLite (see `store::reservations`): one row each in
//! `swin_cost_reservations`, each change one write transaction (the write lock: a
//! commit's `DELETE … RETURNING` ends it exactly once, an extend's `UPDATE … RETURNING`
//! raises it only while it is live).

use swin_core::UnixMs;

use super::{commit_by, err, SqliteStore};
use crate::store::reservations::{
    keys_from, keys_text, OpenReservation, ReservationRecord, ReservationStore, PURGE_AT_ONCE,
};
use crate::StoreError;

type Row = (String, f64, i64);

fn record(row: Option<Row>) -> Result<Option<ReservationRecord>, StoreError> {
    row.map(|(keys, total, expires_at)| {
        Ok(ReservationRecord {
            keys: keys_from(&keys)?,
            total,
            expires_at: UnixMs(expires_at),
        })
    })
    .transpose()
}

impl ReservationStore for SqliteStore {
    async fn open_reservations(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM swin_cost_reservations WHERE namespace = ?1 AND expires_at > ?2",
        )
        .bind(namespace)
        .bind(now.0)
        .fetch_one(self.pool())
        .await
        .map_err(err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn open_reservation(
        &self,
        namespace: &str,
        o: OpenReservation<'_>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        sqlx::query(
            "DELETE FROM swin_cost_reservations WHERE (namespace, id) IN (
                 SELECT namespace, id FROM swin_cost_reservations
                 WHERE namespace = ?1 AND expires_at <= ?2 LIMIT ?3)",
        )
        .bind(namespace)
        .bind(o.now.0)
        .bind(PURGE_AT_ONCE)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let written = sqlx::query(
            "INSERT INTO swin_cost_reservations (namespace, id, keys, total, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (namespace, id) DO UPDATE
             SET keys = EXCLUDED.keys, total = EXCLUDED.total, expires_at = EXCLUDED.expires_at
             WHERE swin_cost_reservations.expires_at <= ?6",
        )
        .bind(namespace)
        .bind(o.id)
        .bind(keys_text(o.keys))
        .bind(o.total)
        .bind(o.expires_at.0)
        .bind(o.now.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        tx.commit().await.map_err(err)?;
        Ok(written > 0)
    }

    async fn extend_reservation(
        &self,
        namespace: &str,
        id: &str,
        more: f64,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let row: Option<Row> = sqlx::query_as(
            "UPDATE swin_cost_reservations SET total = total + ?3
             WHERE namespace = ?1 AND id = ?2 AND expires_at > ?4
             RETURNING keys, total, expires_at",
        )
        .bind(namespace)
        .bind(id)
        .bind(more)
        .bind(now.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        commit_by(tx, not_after).await?;
        record(row)
    }

    async fn take_reservation(
        &self,
        namespace: &str,
        id: &str,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let row: Option<Row> = sqlx::query_as(
            "DELETE FROM swin_cost_reservations
             WHERE namespace = ?1 AND id = ?2 AND expires_at > ?3
             RETURNING keys, total, expires_at",
        )
        .bind(namespace)
        .bind(id)
        .bind(now.0)
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        commit_by(tx, not_after).await?;
        record(row)
    }

    async fn read_reservation(
        &self,
        namespace: &str,
        id: &str,
        now: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let row: Option<Row> = sqlx::query_as(
            "SELECT keys, total, expires_at FROM swin_cost_reservations
             WHERE namespace = ?1 AND id = ?2 AND expires_at > ?3",
        )
        .bind(namespace)
        .bind(id)
        .bind(now.0)
        .fetch_optional(self.pool())
        .await
        .map_err(err)?;
        record(row)
    }
}
