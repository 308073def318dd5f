//! Demands of Envoy's quota service on SQLite (see `store::demands`).

use swin_core::UnixMs;

use super::{err, SqliteStore};
use crate::store::demands::{DemandStore, Demands};
use crate::StoreError;

impl DemandStore for SqliteStore {
    async fn post_demands(&self, namespace: &str, entries: &[Demands]) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        for e in entries {
            sqlx::query(
                "INSERT INTO swin_demands (namespace, bucket, node, demands, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (namespace, bucket, node)
                 DO UPDATE SET demands = excluded.demands, expires_at = excluded.expires_at",
            )
            .bind(namespace)
            .bind(&e.bucket)
            .bind(&e.node)
            .bind(e.text())
            .bind(e.expires_at.0)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)
    }

    async fn read_demands(
        &self,
        namespace: &str,
        buckets: &[&str],
        now: UnixMs,
    ) -> Result<Vec<Demands>, StoreError> {
        let mut out = Vec::new();
        // one JSON array per statement: no limit on bound parameters
        for chunk in buckets.chunks(5_000) {
            let buckets = serde_json::to_string(chunk)
                .map_err(|e| StoreError::Protocol(format!("buckets as JSON: {e}")))?;
            let rows: Vec<(String, String, String, i64)> = sqlx::query_as(
                "SELECT bucket, node, demands, expires_at FROM swin_demands
                 WHERE namespace = ?1 AND expires_at > ?3
                   AND bucket IN (SELECT value FROM json_each(?2))",
            )
            .bind(namespace)
            .bind(buckets)
            .bind(now.0)
            .fetch_all(self.pool())
            .await
            .map_err(err)?;
            out.extend(super::super::demands::from_rows(rows));
        }
        Ok(out)
    }
}
