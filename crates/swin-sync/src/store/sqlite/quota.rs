//! Strict admission on SQLite: holds and grants, each settled in one write
//! transaction.

use super::*;

impl Quota for SqliteStore {
    async fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> Result<Vec<Held>, StoreError> {
        let holder = holder.as_str();
        let wanted: Vec<serde_json::Value> = holds
            .iter()
            .map(|h| serde_json::json!([h.key.as_str(), h.window_size, h.window_start]))
            .collect();
        let wanted = serde_json::Value::Array(wanted).to_string();
        let mut tx = self.pool.begin().await.map_err(err)?;
        // a write first: the transaction takes the write lock before it reads
        sqlx::query(
            "INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
             SELECT ?1, r.value ->> 0, r.value ->> 1, r.value ->> 2, 0 FROM json_each(?2) AS r
             WHERE true ON CONFLICT DO NOTHING",
        )
        .bind(namespace)
        .bind(&wanted)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let rows: Vec<crate::store::sql::HoldRow> = sqlx::query_as(
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
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let (answers, changed) = crate::store::sql::settle_holds(holds, rows)?;
        for ((key, size, start), state) in &changed {
            sqlx::query(
                "UPDATE swin_counters SET count = ?5, updated_at = unixepoch()
                 WHERE namespace = ?1 AND key = ?2 AND window_size = ?3 AND window_start = ?4",
            )
            .bind(namespace)
            .bind(key.as_str())
            .bind(i64::from(*size))
            .bind(*start)
            .bind(state.current)
            .execute(&mut *tx)
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
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(answers)
    }

    async fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, StoreError> {
        let holder = holder.as_str();
        let keys: Vec<&str> = grants.iter().map(|r| r.key.as_str()).collect();
        let keys = serde_json::to_string(&keys).unwrap_or_default();
        let mut tx = self.pool.begin().await.map_err(err)?;
        // a write first: the transaction takes the write lock before it reads (a new
        // bucket is full: a TAT long past)
        sqlx::query(
            "INSERT INTO swin_buckets (namespace, key, tat_ns)
             SELECT ?1, r.value, 0 FROM json_each(?2) AS r WHERE true ON CONFLICT DO NOTHING",
        )
        .bind(namespace)
        .bind(&keys)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        let rows: Vec<crate::store::sql::GrantRow> = sqlx::query_as(
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
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let settled = crate::store::sql::settle_grants(grants, rows)?;
        for (key, tat_ns) in &settled.tats {
            sqlx::query(
                "UPDATE swin_buckets SET tat_ns = ?3, updated_at = unixepoch()
                 WHERE namespace = ?1 AND key = ?2",
            )
            .bind(namespace)
            .bind(key.as_str())
            .bind(*tat_ns)
            .execute(&mut *tx)
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
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(settled.answers)
    }
}
