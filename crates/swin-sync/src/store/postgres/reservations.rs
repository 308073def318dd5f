//! Reservations of a cost on PostgreSQL (see `store::reservations`): one row each in
//! `swin_cost_reservations`; a commit's `DELETE … RETURNING` ends it exactly once, an
//! extend's `UPDATE … RETURNING` raises it only while it is live.

use swin_core::UnixMs;

use super::{commit_by, err, PostgresStore};
use crate::store::reservations::{
    counted_text, keys_text, record, sql, OpenReservation, RecordRow, ReservationRecord,
    ReservationStore, MAX_COUNTED_TEXT, PURGE_AT_ONCE,
};
use crate::StoreError;

impl ReservationStore for PostgresStore {
    async fn open_reservations(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(sql::COUNT)
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
                 WHERE namespace = $1 AND expires_at <= $2 LIMIT $3
                 FOR UPDATE SKIP LOCKED)",
        )
        .bind(namespace)
        .bind(o.now.0)
        .bind(PURGE_AT_ONCE)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let written = sqlx::query(sql::OPEN)
            .bind(namespace)
            .bind(o.id)
            .bind(keys_text(o.keys))
            .bind(o.total)
            .bind(o.expires_at.0)
            .bind(o.now.0)
            .bind(counted_text(o.at, o.total))
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
        at: UnixMs,
        now: UnixMs,
        not_after: UnixMs,
    ) -> Result<Option<ReservationRecord>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let row: Option<RecordRow> = sqlx::query_as(sql::EXTEND)
            .bind(namespace)
            .bind(id)
            .bind(more)
            .bind(now.0)
            .bind(counted_text(at, more))
            .bind(MAX_COUNTED_TEXT as i64)
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
        let row: Option<RecordRow> = sqlx::query_as(sql::TAKE)
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
        let row: Option<RecordRow> = sqlx::query_as(sql::READ)
            .bind(namespace)
            .bind(id)
            .bind(now.0)
            .fetch_optional(self.pool())
            .await
            .map_err(err)?;
        record(row)
    }
}
