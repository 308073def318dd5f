//! PostgreSQL's statements for the steps of a write transaction (the SQL stores' one
//! implementation of [`SqlTx`](crate::store::sql::SqlTx),
//! [`sql_tx!`](crate::store::sql_tx::sql_tx)): a push's record and rows (the slow path
//! that isolates refused rows), strict admission's holds and grants, every row locked in
//! key order as pushes lock them.

use super::*;
use crate::store::sql::HoldWindow;
use crate::store::sql_tx::{hold_states, sql_tx};
use crate::store::{Grant, Granted, Held, Hold, QuotaStore};

/// A transaction on PostgreSQL.
pub(super) struct Tx(pub(super) sqlx::Transaction<'static, sqlx::Postgres>);

/// Records the push `(node, namespace, seq)` in `tx`; false when it was applied before.
async fn record_push(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    node: &str,
    namespace: &str,
    seq: u64,
) -> Result<bool, StoreError> {
    let fresh = sqlx::query(RECORD_PUSH)
        .bind(node)
        .bind(namespace)
        .bind(seq as i64)
        .execute(&mut **tx)
        .await
        .map_err(err)?
        .rows_affected();
    Ok(fresh > 0)
}

/// Adds `diffs` in `tx` ([`PUSH`] without its own record).
async fn upsert_in(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    namespace: &str,
    diffs: &[Diff],
) -> Result<Vec<Total>, StoreError> {
    upsert(&mut **tx, namespace, diffs, "", None).await
}

/// The windows' new counts and the holder's new totals, in one statement.
async fn write_holds(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    namespace: &str,
    holder: &str,
    changed: &[(HoldWindow, swin_core::HoldState)],
) -> Result<(), StoreError> {
    sqlx::query(HOLD_WRITE)
        .bind(namespace)
        .bind(hold_states(changed))
        .bind(holder)
        .execute(&mut **tx)
        .await
        .map_err(err)?;
    Ok(())
}

/// Holds' step 3: the windows' new counts (`$2`: `[key, size, start, count, held]`) and
/// the holder's (`$3`) new totals.
const HOLD_WRITE: &str = "
        WITH v AS (
            SELECT r ->> 0 AS key, (r ->> 1)::int4 AS window_size,
                   (r ->> 2)::int8 AS window_start, (r ->> 3)::float8 AS count,
                   (r ->> 4)::float8 AS held
            FROM json_array_elements($2::json) AS r
        ), counted AS (
            UPDATE swin_counters c SET count = v.count, updated_at = now()
            FROM v WHERE c.namespace = $1 AND c.key = v.key AND c.window_size = v.window_size
             AND c.window_start = to_timestamp(v.window_start)
        )
        INSERT INTO swin_holds (namespace, key, window_size, window_start, holder, held)
        SELECT $1, v.key, v.window_size, to_timestamp(v.window_start), $3, v.held FROM v
        ON CONFLICT (namespace, key, window_size, window_start, holder)
        DO UPDATE SET held = excluded.held, updated_at = now()";

sql_tx! {
    Tx,
    err: err,
    record_push: record_push,
    upsert: upsert_in,
    // every window a hold touches has a row (new rows start at 0), locked here, in key
    // order: the read below is a statement of its own, so it sees every hold and push
    // that held a lock before this one (a read that waited for the lock itself would see
    // the holder's hold as its statement began, before the hold it waited for)
    hold_rows: "
        INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
        SELECT DISTINCT $1, r ->> 0, (r ->> 1)::int4, to_timestamp((r ->> 2)::int8), 0::float8
        FROM json_array_elements($2::json) AS r
        ORDER BY 2, 3, 4
        ON CONFLICT (namespace, key, window_size, window_start)
        DO UPDATE SET count = swin_counters.count",
    hold_read: "
        SELECT c.key, c.window_size::int8, extract(epoch FROM c.window_start)::int8, c.count,
               coalesce(p.count, 0), coalesce(h.held, 0)
        FROM (SELECT DISTINCT r ->> 0 AS key, (r ->> 1)::int4 AS window_size,
                     (r ->> 2)::int8 AS window_start
              FROM json_array_elements($2::json) AS r) r
        JOIN swin_counters c ON c.namespace = $1 AND c.key = r.key
         AND c.window_size = r.window_size AND c.window_start = to_timestamp(r.window_start)
        LEFT JOIN swin_counters p ON p.namespace = $1 AND p.key = r.key
         AND p.window_size = r.window_size
         AND p.window_start = to_timestamp(r.window_start - r.window_size)
        LEFT JOIN swin_holds h ON h.namespace = $1 AND h.key = r.key
         AND h.window_size = r.window_size AND h.window_start = c.window_start
         AND h.holder = $3
        ORDER BY c.key, c.window_size, c.window_start
        FOR UPDATE OF c",
    write_holds: write_holds,
    // every bucket a grant touches has a row, locked here (as a hold's windows are)
    grant_rows: "
        INSERT INTO swin_buckets (namespace, key, tat_ns)
        SELECT $1, k, 0 FROM json_array_elements_text($2::json) AS k ORDER BY 2
        ON CONFLICT (namespace, key) DO UPDATE SET tat_ns = swin_buckets.tat_ns",
    grant_read: "
        SELECT b.key, b.tat_ns, r.seq, r.granted
        FROM swin_buckets b
        LEFT JOIN swin_reservations r ON r.namespace = b.namespace AND r.key = b.key
         AND r.holder = $3
        WHERE b.namespace = $1 AND b.key IN (SELECT json_array_elements_text($2::json))
        ORDER BY b.key
        FOR UPDATE OF b",
    grant_tats: "
        UPDATE swin_buckets b SET tat_ns = v.tat_ns, updated_at = now()
        FROM (SELECT r ->> 0 AS key, (r ->> 1)::int8 AS tat_ns
              FROM json_array_elements($2::json) AS r) v
        WHERE b.namespace = $1 AND b.key = v.key",
    grant_records: "
        INSERT INTO swin_reservations (namespace, key, holder, seq, granted, horizon_end_ns)
        SELECT $1, r ->> 0, $3, (r ->> 1)::int8, (r ->> 2)::int8, (r ->> 3)::int8
        FROM json_array_elements($2::json) AS r
        ON CONFLICT (namespace, key, holder) DO UPDATE SET seq = excluded.seq,
         granted = excluded.granted, horizon_end_ns = excluded.horizon_end_ns",
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
