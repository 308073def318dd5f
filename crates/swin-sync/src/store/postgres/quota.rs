//! Strict admission on PostgreSQL: holds and grants, each settled in one transaction
//! with the rows locked in key order.

use super::*;
use crate::store::sql::GrantRow;
use crate::store::{Grant, Granted, Held, Hold, Quota};

impl Quota for PostgresStore {
    #[instrument(skip_all, fields(namespace, holds = holds.len()))]
    async fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> Result<Vec<Held>, StoreError> {
        let holder = holder.as_str();
        let k: Vec<&str> = holds.iter().map(|h| h.key.as_str()).collect();
        let sizes: Vec<i32> = holds.iter().map(|h| h.window_size as i32).collect();
        let starts: Vec<i64> = holds.iter().map(|h| h.window_start).collect();
        let mut tx = self.pool.begin().await.map_err(err)?;
        // the current windows' rows exist and are locked in key order (as pushes lock
        // them): the read below sees every other grant and push before it
        sqlx::query(HOLD_ROWS)
            .bind(namespace)
            .bind(&k)
            .bind(&sizes)
            .bind(&starts)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let rows: Vec<crate::store::sql::HoldRow> = sqlx::query_as(HOLD_READ)
            .bind(namespace)
            .bind(&k)
            .bind(&sizes)
            .bind(&starts)
            .bind(holder)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let (answers, changed) = crate::store::sql::settle_holds(holds, rows)?;
        if !changed.is_empty() {
            let ck: Vec<&str> = changed.iter().map(|(w, _)| w.0.as_str()).collect();
            let cs: Vec<i32> = changed.iter().map(|(w, _)| w.1 as i32).collect();
            let cst: Vec<i64> = changed.iter().map(|(w, _)| w.2).collect();
            let counts: Vec<f64> = changed.iter().map(|(_, s)| s.current).collect();
            let held: Vec<f64> = changed.iter().map(|(_, s)| s.held).collect();
            sqlx::query(HOLD_WRITE)
                .bind(namespace)
                .bind(&ck)
                .bind(&cs)
                .bind(&cst)
                .bind(&counts)
                .bind(holder)
                .bind(&held)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(answers)
    }

    #[instrument(skip_all, fields(namespace, grants = grants.len()))]
    async fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, StoreError> {
        let holder = holder.as_str();
        let mut keys: Vec<&str> = grants.iter().map(|r| r.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut tx = self.pool.begin().await.map_err(err)?;
        // every bucket has a row (a new one is full: a TAT long past), locked in key
        // order as pushes lock them
        sqlx::query(GRANT_ROWS)
            .bind(namespace)
            .bind(&keys)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let rows: Vec<GrantRow> = sqlx::query_as(GRANT_READ)
            .bind(namespace)
            .bind(&keys)
            .bind(holder)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let settled = crate::store::sql::settle_grants(grants, rows)?;
        if !settled.tats.is_empty() {
            let k: Vec<&str> = settled.tats.iter().map(|(k, _)| k.as_str()).collect();
            let t: Vec<i64> = settled.tats.iter().map(|(_, t)| *t).collect();
            sqlx::query(
                "UPDATE swin_buckets b SET tat_ns = v.tat_ns, updated_at = now()
                 FROM unnest($2::text[], $3::int8[]) AS v(key, tat_ns)
                 WHERE b.namespace = $1 AND b.key = v.key",
            )
            .bind(namespace)
            .bind(&k)
            .bind(&t)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        let r = &settled.records;
        let k: Vec<&str> = r.iter().map(|r| r.0.as_str()).collect();
        let seq: Vec<i64> = r.iter().map(|r| r.1).collect();
        let granted: Vec<i64> = r.iter().map(|r| r.2).collect();
        let end: Vec<i64> = r.iter().map(|r| r.3).collect();
        sqlx::query(
            "INSERT INTO swin_reservations (namespace, key, holder, seq, granted, horizon_end_ns)
             SELECT $1, v.key, $2, v.seq, v.granted, v.horizon_end_ns
             FROM unnest($3::text[], $4::int8[], $5::int8[], $6::int8[])
             AS v(key, seq, granted, horizon_end_ns)
             ON CONFLICT (namespace, key, holder) DO UPDATE SET seq = excluded.seq,
              granted = excluded.granted, horizon_end_ns = excluded.horizon_end_ns",
        )
        .bind(namespace)
        .bind(holder)
        .bind(&k)
        .bind(&seq)
        .bind(&granted)
        .bind(&end)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(settled.answers)
    }
}

/// Strict admission of buckets, step 1: every bucket a grant touches has a row.
const GRANT_ROWS: &str = "
    INSERT INTO swin_buckets (namespace, key, tat_ns)
    SELECT $1, k, 0 FROM unnest($2::text[]) AS k ORDER BY 2
    ON CONFLICT DO NOTHING";

/// Step 2: the buckets, locked in key order, with the holder's last grant.
const GRANT_READ: &str = "
    SELECT b.key, b.tat_ns, r.seq, r.granted
    FROM swin_buckets b
    LEFT JOIN swin_reservations r ON r.namespace = b.namespace AND r.key = b.key
     AND r.holder = $3
    WHERE b.namespace = $1 AND b.key = ANY($2)
    ORDER BY b.key
    FOR UPDATE OF b";

/// Strict admission, step 1: every window a hold touches has a row (new rows start at 0).
const HOLD_ROWS: &str = "
    INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
    SELECT DISTINCT $1, r.key, r.window_size, to_timestamp(r.window_start), 0::float8
    FROM unnest($2::text[], $3::int4[], $4::int8[]) AS r(key, window_size, window_start)
    ORDER BY 2, 3, 4
    ON CONFLICT DO NOTHING";

/// Step 2: the windows, locked in key order, with the previous window and the holder's
/// total beside each.
const HOLD_READ: &str = "
    SELECT c.key, c.window_size::int8, extract(epoch FROM c.window_start)::int8, c.count,
           coalesce(p.count, 0), coalesce(h.held, 0)
    FROM (SELECT DISTINCT * FROM unnest($2::text[], $3::int4[], $4::int8[])
          AS r(key, window_size, window_start)) r
    JOIN swin_counters c ON c.namespace = $1 AND c.key = r.key
     AND c.window_size = r.window_size AND c.window_start = to_timestamp(r.window_start)
    LEFT JOIN swin_counters p ON p.namespace = $1 AND p.key = r.key
     AND p.window_size = r.window_size
     AND p.window_start = to_timestamp(r.window_start - r.window_size)
    LEFT JOIN swin_holds h ON h.namespace = $1 AND h.key = r.key
     AND h.window_size = r.window_size AND h.window_start = c.window_start AND h.holder = $5
    ORDER BY c.key, c.window_size, c.window_start
    FOR UPDATE OF c";

/// Step 3: the windows' new counts and the holder's new totals.
const HOLD_WRITE: &str = "
    WITH v AS (
        SELECT * FROM unnest($2::text[], $3::int4[], $4::int8[], $5::float8[], $7::float8[])
        AS v(key, window_size, window_start, count, held)
    ), counted AS (
        UPDATE swin_counters c SET count = v.count, updated_at = now()
        FROM v WHERE c.namespace = $1 AND c.key = v.key AND c.window_size = v.window_size
         AND c.window_start = to_timestamp(v.window_start)
    )
    INSERT INTO swin_holds (namespace, key, window_size, window_start, holder, held)
    SELECT $1, v.key, v.window_size, to_timestamp(v.window_start), $6, v.held FROM v
    ON CONFLICT (namespace, key, window_size, window_start, holder)
    DO UPDATE SET held = excluded.held, updated_at = now()";
