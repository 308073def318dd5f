//! SQLite's statements for the steps of a write transaction ([`SqlTx`]): a push's record
//! and rows, strict admission's holds and grants. Every transaction writes first, so it
//! takes the write lock (waiting on busy_timeout) before it reads.

use super::*;
use crate::store::sql::{GrantRow, HoldRow, HoldWindow, SettledGrants, SqlTx};

/// A write transaction on SQLite.
pub(super) struct Tx(pub(super) sqlx::Transaction<'static, sqlx::Sqlite>);

impl SqlTx for Tx {
    fn record_push<'a>(
        &'a mut self,
        node: &'a str,
        namespace: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(record_push(&mut self.0, node, namespace, seq))
    }

    fn execute(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            sqlx::query(sql).execute(&mut *self.0).await.map_err(err)?;
            Ok(())
        })
    }

    fn upsert<'a>(
        &'a mut self,
        namespace: &'a str,
        diffs: &'a [Diff],
    ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>> {
        Box::pin(upsert(&mut self.0, namespace, diffs))
    }

    fn lock_holds<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        holds: &'a [Hold],
    ) -> BoxFuture<'a, Result<Vec<HoldRow>, StoreError>> {
        Box::pin(async move {
            let wanted: Vec<serde_json::Value> = holds
                .iter()
                .map(|h| serde_json::json!([h.key.as_str(), h.window_size, h.window_start]))
                .collect();
            let wanted = serde_json::Value::Array(wanted).to_string();
            sqlx::query(
                "INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
                 SELECT ?1, r.value ->> 0, r.value ->> 1, r.value ->> 2, 0 FROM json_each(?2) AS r
                 WHERE true ON CONFLICT DO NOTHING",
            )
            .bind(namespace)
            .bind(&wanted)
            .execute(&mut *self.0)
            .await
            .map_err(err)?;
            sqlx::query_as(
                "SELECT c.key, c.window_size, c.window_start, c.count,
                        coalesce(p.count, 0.0), coalesce(h.held, 0.0)
                 FROM json_each(?2) AS r
                 CROSS JOIN swin_counters c
                 LEFT JOIN swin_counters p ON p.namespace = ?1 AND p.key = c.key
                  AND p.window_size = c.window_size
                  AND p.window_start = c.window_start - c.window_size
                 LEFT JOIN swin_holds h ON h.namespace = ?1 AND h.key = c.key
                  AND h.window_size = c.window_size AND h.window_start = c.window_start
                  AND h.holder = ?3
                 WHERE c.namespace = ?1 AND c.key = r.value ->> 0
                  AND c.window_size = r.value ->> 1 AND c.window_start = r.value ->> 2",
            )
            .bind(namespace)
            .bind(&wanted)
            .bind(holder)
            .fetch_all(&mut *self.0)
            .await
            .map_err(err)
        })
    }

    fn write_holds<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        changed: &'a [(HoldWindow, swin_core::HoldState)],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            for ((key, size, start), state) in changed {
                sqlx::query(
                    "UPDATE swin_counters SET count = ?5, updated_at = unixepoch()
                     WHERE namespace = ?1 AND key = ?2 AND window_size = ?3 AND window_start = ?4",
                )
                .bind(namespace)
                .bind(key.as_str())
                .bind(i64::from(*size))
                .bind(*start)
                .bind(state.current)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
                sqlx::query(
                    "INSERT INTO swin_holds (namespace, key, window_size, window_start, holder, held)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT DO UPDATE SET held = excluded.held, updated_at = unixepoch()",
                )
                .bind(namespace)
                .bind(key.as_str())
                .bind(i64::from(*size))
                .bind(*start)
                .bind(holder)
                .bind(state.held)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
            }
            Ok(())
        })
    }

    fn lock_buckets<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<GrantRow>, StoreError>> {
        Box::pin(async move {
            let keys = serde_json::to_string(keys).unwrap_or_default();
            sqlx::query(
                "INSERT INTO swin_buckets (namespace, key, tat_ns)
                 SELECT ?1, r.value, 0 FROM json_each(?2) AS r WHERE true ON CONFLICT DO NOTHING",
            )
            .bind(namespace)
            .bind(&keys)
            .execute(&mut *self.0)
            .await
            .map_err(err)?;
            sqlx::query_as(
                "SELECT DISTINCT b.key, b.tat_ns, s.seq, s.granted
                 FROM json_each(?2) AS r
                 CROSS JOIN swin_buckets b
                 LEFT JOIN swin_reservations s ON s.namespace = ?1 AND s.key = b.key
                  AND s.holder = ?3
                 WHERE b.namespace = ?1 AND b.key = r.value",
            )
            .bind(namespace)
            .bind(&keys)
            .bind(holder)
            .fetch_all(&mut *self.0)
            .await
            .map_err(err)
        })
    }

    fn write_grants<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        settled: &'a SettledGrants,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            for (key, tat_ns) in &settled.tats {
                sqlx::query(
                    "UPDATE swin_buckets SET tat_ns = ?3, updated_at = unixepoch()
                     WHERE namespace = ?1 AND key = ?2",
                )
                .bind(namespace)
                .bind(key.as_str())
                .bind(*tat_ns)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
            }
            for (key, seq, granted, end) in &settled.records {
                sqlx::query(
                    "INSERT INTO swin_reservations (namespace, key, holder, seq, granted, horizon_end_ns)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                     ON CONFLICT DO UPDATE SET seq = excluded.seq, granted = excluded.granted,
                      horizon_end_ns = excluded.horizon_end_ns",
                )
                .bind(namespace)
                .bind(key.as_str())
                .bind(holder)
                .bind(*seq)
                .bind(*granted)
                .bind(*end)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
            }
            Ok(())
        })
    }

    fn commit(self) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(async move { self.0.commit().await.map_err(err) })
    }

    fn rollback(self) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(async move { self.0.rollback().await.map_err(err) })
    }
}

impl QuotaStore for SqliteStore {
    async fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> Result<Vec<Held>, StoreError> {
        sql::hold(self.begin().await?, namespace, holder, holds).await
    }

    async fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, StoreError> {
        sql::grant(self.begin().await?, namespace, holder, grants).await
    }
}
