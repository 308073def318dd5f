//! PostgreSQL's statements for the steps of a write transaction ([`SqlTx`]): a push's
//! record and rows (the slow path that isolates refused rows), strict admission's holds
//! and grants, every row locked in key order as pushes lock them.

use super::*;
use crate::store::sql::{self, GrantRow, HoldRow, HoldWindow, SettledGrants, SqlTx};
use crate::store::{Grant, Granted, Held, Hold, QuotaStore};

/// A transaction on PostgreSQL.
pub(super) struct Tx(pub(super) sqlx::Transaction<'static, sqlx::Postgres>);

impl SqlTx for Tx {
    fn record_push<'a>(
        &'a mut self,
        node: &'a str,
        namespace: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let fresh = sqlx::query(RECORD_PUSH)
                .bind(node)
                .bind(namespace)
                .bind(seq as i64)
                .execute(&mut *self.0)
                .await
                .map_err(err)?
                .rows_affected();
            Ok(fresh > 0)
        })
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
        Box::pin(upsert(&mut *self.0, namespace, diffs, "", None))
    }

    fn lock_holds<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        holds: &'a [Hold],
    ) -> BoxFuture<'a, Result<Vec<HoldRow>, StoreError>> {
        Box::pin(async move {
            let k: Vec<&str> = holds.iter().map(|h| h.key.as_str()).collect();
            let sizes: Vec<i32> = holds.iter().map(|h| h.window_size as i32).collect();
            let starts: Vec<i64> = holds.iter().map(|h| h.window_start).collect();
            // the read below sees every other hold and push before it
            sqlx::query(HOLD_ROWS)
                .bind(namespace)
                .bind(&k)
                .bind(&sizes)
                .bind(&starts)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
            sqlx::query_as(HOLD_READ)
                .bind(namespace)
                .bind(&k)
                .bind(&sizes)
                .bind(&starts)
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
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
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
            sqlx::query(GRANT_ROWS)
                .bind(namespace)
                .bind(keys)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
            sqlx::query_as(GRANT_READ)
                .bind(namespace)
                .bind(keys)
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
            if !settled.tats.is_empty() {
                let k: Vec<&str> = settled.tats.iter().map(|(k, _)| k.as_str()).collect();
                let t: Vec<i64> = settled.tats.iter().map(|(_, t)| *t).collect();
                sqlx::query(GRANT_TATS)
                    .bind(namespace)
                    .bind(&k)
                    .bind(&t)
                    .execute(&mut *self.0)
                    .await
                    .map_err(err)?;
            }
            let r = &settled.records;
            let k: Vec<&str> = r.iter().map(|r| r.0.as_str()).collect();
            let seq: Vec<i64> = r.iter().map(|r| r.1).collect();
            let granted: Vec<i64> = r.iter().map(|r| r.2).collect();
            let end: Vec<i64> = r.iter().map(|r| r.3).collect();
            sqlx::query(GRANT_RECORDS)
                .bind(namespace)
                .bind(holder)
                .bind(&k)
                .bind(&seq)
                .bind(&granted)
                .bind(&end)
                .execute(&mut *self.0)
                .await
                .map_err(err)?;
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

impl QuotaStore for PostgresStore {
    #[instrument(skip_all, fields(namespace, holds = holds.len()))]
    async fn hold(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        holds: &[Hold],
    ) -> Result<Vec<Held>, StoreError> {
        sql::hold(self.begin().await?, namespace, holder, holds).await
    }

    #[instrument(skip_all, fields(namespace, grants = grants.len()))]
    async fn grant(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        grants: &[Grant],
    ) -> Result<Vec<Granted>, StoreError> {
        sql::grant(self.begin().await?, namespace, holder, grants).await
    }
}

/// Strict admission of buckets, step 3: the TATs that moved.
const GRANT_TATS: &str = "
    UPDATE swin_buckets b SET tat_ns = v.tat_ns, updated_at = now()
    FROM unnest($2::text[], $3::int8[]) AS v(key, tat_ns)
    WHERE b.namespace = $1 AND b.key = v.key";

/// Step 4: the holder's last request number and grant per bucket.
const GRANT_RECORDS: &str = "
    INSERT INTO swin_reservations (namespace, key, holder, seq, granted, horizon_end_ns)
    SELECT $1, v.key, $2, v.seq, v.granted, v.horizon_end_ns
    FROM unnest($3::text[], $4::int8[], $5::int8[], $6::int8[])
    AS v(key, seq, granted, horizon_end_ns)
    ON CONFLICT (namespace, key, holder) DO UPDATE SET seq = excluded.seq,
     granted = excluded.granted, horizon_end_ns = excluded.horizon_end_ns";

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
