//! SQLite's statements for the steps of a write transaction (the SQL stores' one
//! implementation of [`SqlTx`](crate::store::sql::SqlTx),
//! [`sql_tx!`](crate::store::sql_tx::sql_tx)): a push's record and rows, strict
//! admission's holds and grants. Every transaction writes first, so it takes the write
//! lock (waiting on busy_timeout) before it reads.

use super::*;
use crate::store::sql::HoldWindow;
use crate::store::sql_tx::sql_tx;

/// A write transaction on SQLite.
pub(super) struct Tx(pub(super) sqlx::Transaction<'static, sqlx::Sqlite>);

/// Adds `diffs` in `tx`.
async fn upsert_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    namespace: &str,
    diffs: &[Diff],
) -> Result<Vec<Total>, StoreError> {
    upsert(tx, namespace, diffs).await
}

/// The windows' new counts and the holder's new totals, a statement each, their numbers
/// bound as doubles (SQLite's reading of a number's text is not correctly rounded: a
/// count through JSON could come back a unit in the last place off).
async fn write_holds(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    namespace: &str,
    holder: &str,
    changed: &[(HoldWindow, swin_core::HoldState)],
) -> Result<(), StoreError> {
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
        .execute(&mut **tx)
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
        .execute(&mut **tx)
        .await
        .map_err(err)?;
    }
    Ok(())
}

sql_tx! {
    Tx,
    err: err,
    record_push: record_push,
    upsert: upsert_in,
    hold_rows: "
        INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
        SELECT ?1, r.value ->> 0, r.value ->> 1, r.value ->> 2, 0 FROM json_each(?2) AS r
        WHERE true ON CONFLICT DO NOTHING",
    hold_read: "
        SELECT c.key, c.window_size, c.window_start, c.count,
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
    write_holds: write_holds,
    grant_rows: "
        INSERT INTO swin_buckets (namespace, key, tat_ns)
        SELECT ?1, r.value, 0 FROM json_each(?2) AS r WHERE true ON CONFLICT DO NOTHING",
    grant_read: "
        SELECT DISTINCT b.key, b.tat_ns, s.seq, s.granted
        FROM json_each(?2) AS r
        CROSS JOIN swin_buckets b
        LEFT JOIN swin_reservations s ON s.namespace = ?1 AND s.key = b.key
         AND s.holder = ?3
        WHERE b.namespace = ?1 AND b.key = r.value",
    grant_tats: "
        UPDATE swin_buckets AS b SET tat_ns = r.value ->> 1, updated_at = unixepoch()
        FROM json_each(?2) AS r
        WHERE b.namespace = ?1 AND b.key = r.value ->> 0",
    grant_records: "
        INSERT INTO swin_reservations (namespace, key, holder, seq, granted, horizon_end_ns)
        SELECT ?1, r.value ->> 0, ?3, r.value ->> 1, r.value ->> 2, r.value ->> 3
        FROM json_each(?2) AS r WHERE true
        ON CONFLICT DO UPDATE SET seq = excluded.seq, granted = excluded.granted,
         horizon_end_ns = excluded.horizon_end_ns",
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
