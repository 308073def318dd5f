//! Strict admission on PostgreSQL: holds and grants, each settled in one transaction
//! with the rows locked in key order.

use super::*;

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
        // them): the read below sees every other reservation and push before it
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

    #[instrument(skip_all, fields(namespace, reserves = reserves.len()))]
    async fn reserve(
        &self,
        namespace: &str,
        holder: &crate::Holder,
        reserves: &[Reserve],
    ) -> Result<Vec<Granted>, StoreError> {
        let holder = holder.as_str();
        let mut keys: Vec<&str> = reserves.iter().map(|r| r.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut tx = self.pool.begin().await.map_err(err)?;
        // every bucket has a row (a new one is full: a TAT long past), locked in key
        // order as pushes lock them
        sqlx::query(RESERVE_ROWS)
            .bind(namespace)
            .bind(&keys)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let rows: Vec<ReserveRow> = sqlx::query_as(RESERVE_READ)
            .bind(namespace)
            .bind(&keys)
            .bind(holder)
            .fetch_all(&mut *tx)
            .await
            .map_err(err)?;
        let settled = crate::store::sql::settle_reserves(reserves, rows)?;
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
