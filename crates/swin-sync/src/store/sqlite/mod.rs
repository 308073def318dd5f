//! SQLite store, the embedded default: the same tables and semantics as PostgreSQL in
//! one file that several nodes on one host share (WAL). A batch travels as one JSON
//! array expanded by `json_each`, inside one write transaction.
//! Each write transaction's statements are in `tx.rs`.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use swin_core::{CompactString, Diff, Tat, Total, UnixMs};

use super::sql::{self, tats, totals, TatRow, TotalRow};
use super::{
    normalize, normalize_advances, Capabilities, CounterStore, Grant, Granted, Held, Hold, Push,
    Pushed, QuotaStore, StoreKind, TatPush, WindowKey,
};
use crate::StoreError;

mod demands;
mod idempotency;
mod leases;
mod limits;
mod reservations;
mod tx;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

fn err(e: sqlx::Error) -> StoreError {
    StoreError::Sqlite(e)
}

/// Records a push in `swin_pushes` inside `tx`; false when that push was applied before.
/// As the first statement of the transaction it writes, so the write lock is taken
/// (waiting on busy_timeout) before anything is read.
async fn record_push(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    node_id: &str,
    namespace: &str,
    seq: u64,
) -> Result<bool, StoreError> {
    let fresh = sqlx::query(
        "INSERT INTO swin_pushes (node_id, namespace, seq) VALUES (?1, ?2, ?3)
         ON CONFLICT DO NOTHING",
    )
    .bind(node_id)
    .bind(namespace)
    .bind(seq as i64)
    .execute(&mut **tx)
    .await
    .map_err(err)?
    .rows_affected();
    Ok(fresh > 0)
}

/// Adds `diffs` on `conn`, a count never going below zero: diffs of at least 0 are
/// upserted; negative ones update existing windows to `max(count + diff, 0)` and leave
/// absent windows absent (0). A normalized batch holds each window once. Whole diffs go
/// as one JSON array per direction; a diff with a fraction is bound as a double, a
/// statement of its own (SQLite's reading of a number's text is not correctly rounded:
/// through JSON its sum could be stored a unit in the last place off).
async fn upsert(
    conn: &mut sqlx::SqliteConnection,
    namespace: &str,
    diffs: &[Diff],
) -> Result<Vec<Total>, StoreError> {
    // exact through text: a whole number below 2^53
    let whole = |v: f64| v.fract() == 0.0 && v.abs() < 9_007_199_254_740_992.0;
    let rows = |up: bool| {
        let r: Vec<serde_json::Value> = diffs
            .iter()
            .filter(|d| (d.value >= 0.0) == up && whole(d.value))
            .map(|d| serde_json::json!([d.key.as_str(), d.window_size, d.window_start, d.value]))
            .collect();
        (!r.is_empty()).then(|| serde_json::Value::Array(r).to_string())
    };
    // SQLite would keep an overflowing sum as Inf; as NULL, NOT NULL refuses the row
    // (a rejection) instead of storing a count that poisons every read
    const ADD: &str = "ON CONFLICT (namespace, key, window_size, window_start)
         DO UPDATE SET count = CASE WHEN abs(count + excluded.count) <= 1.7976931348623157e308
             THEN count + excluded.count END, updated_at = unixepoch()
         RETURNING key, window_size, window_start, count";
    let up = format!(
        "INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
         SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(?2) WHERE true
         {ADD}"
    );
    const DOWN: &str = "UPDATE swin_counters AS c SET count = max(c.count + (r.value ->> 3), 0), updated_at = unixepoch()
         FROM json_each(?2) AS r
         WHERE c.namespace = ?1 AND c.key = r.value ->> 0
           AND c.window_size = r.value ->> 1 AND c.window_start = r.value ->> 2
         RETURNING key, window_size, window_start, count";
    let mut out: Vec<TotalRow> = Vec::with_capacity(diffs.len());
    for (up, sql) in [(true, up.as_str()), (false, DOWN)] {
        if let Some(batch) = rows(up) {
            out.extend(
                sqlx::query_as::<_, TotalRow>(sql)
                    .bind(namespace)
                    .bind(&batch)
                    .fetch_all(&mut *conn)
                    .await
                    .map_err(err)?,
            );
        }
    }
    let up_one = format!(
        "INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
         VALUES (?1, ?2, ?3, ?4,
             CASE WHEN abs(?5) <= 1.7976931348623157e308 THEN ?5 END) {ADD}"
    );
    const DOWN_ONE: &str =
        "UPDATE swin_counters SET count = max(count + ?5, 0), updated_at = unixepoch()
         WHERE namespace = ?1 AND key = ?2 AND window_size = ?3 AND window_start = ?4
         RETURNING key, window_size, window_start, count";
    for d in diffs.iter().filter(|d| !whole(d.value)) {
        let sql = if d.value >= 0.0 {
            up_one.as_str()
        } else {
            DOWN_ONE
        };
        let row: Option<TotalRow> = sqlx::query_as(sql)
            .bind(namespace)
            .bind(d.key.as_str())
            .bind(i64::from(d.window_size))
            .bind(d.window_start)
            .bind(d.value)
            .fetch_optional(&mut *conn)
            .await
            .map_err(err)?;
        out.extend(row);
    }
    totals(out)
}

impl SqliteStore {
    /// `url` is `sqlite://path/to/file.db` (created when missing) or `sqlite::memory:`.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let opts = SqliteConnectOptions::from_str(url)
            .map_err(err)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let in_memory = url.contains(":memory:");
        let pool = SqlitePoolOptions::new()
            // an in-memory database lives and dies with its one connection
            .max_connections(if in_memory { 1 } else { 4 })
            .min_connections(if in_memory { 1 } else { 0 })
            .idle_timeout(if in_memory {
                None
            } else {
                Some(Duration::from_secs(600))
            })
            .max_lifetime(if in_memory {
                None
            } else {
                Some(Duration::from_secs(1800))
            })
            .connect_with(opts)
            .await
            .map_err(err)?;
        Ok(SqliteStore { pool })
    }

    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    async fn begin(&self) -> Result<tx::Tx, StoreError> {
        Ok(tx::Tx(self.pool.begin().await.map_err(err)?))
    }
}

impl CounterStore for SqliteStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Sqlite
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pipelines: false,
            expires_by_itself: false,
        }
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    /// One write transaction: the push record, then the rows, isolating any the
    /// database refuses (see `sql::push`).
    async fn push(&self, namespace: &str, push: Push<'_>) -> Result<Pushed, StoreError> {
        let diffs = normalize(push.diffs);
        if diffs.is_empty() {
            return Ok(Pushed::default());
        }
        match sql::push(self.begin().await?, namespace, &push, &diffs).await? {
            Some(pushed) => Ok(pushed),
            None => {
                let windows: Vec<WindowKey> = diffs.iter().map(WindowKey::of).collect();
                Ok(self.read(namespace, &windows).await?.into())
            }
        }
    }

    /// `CROSS JOIN` keeps the wanted windows as the outer loop, so each is one primary
    /// key lookup; left to itself the planner may scan the table once per window.
    async fn read(&self, namespace: &str, keys: &[WindowKey]) -> Result<Vec<Total>, StoreError> {
        let wanted: Vec<serde_json::Value> = keys
            .iter()
            .map(|w| serde_json::json!([w.key.as_str(), w.window_size, w.window_start]))
            .collect();
        let rows: Vec<TotalRow> = sqlx::query_as(
            "SELECT c.key, c.window_size, c.window_start, c.count
             FROM json_each(?2) AS r
             CROSS JOIN swin_counters c
             WHERE c.namespace = ?1 AND c.key = r.value ->> 0
              AND c.window_size = r.value ->> 1 AND c.window_start = r.value ->> 2",
        )
        .bind(namespace)
        .bind(serde_json::Value::Array(wanted).to_string())
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        totals(rows)
    }

    async fn load_namespace(
        &self,
        namespace: &str,
        windows: &[(u32, i64)],
    ) -> Result<Vec<Total>, StoreError> {
        let w: Vec<serde_json::Value> = windows
            .iter()
            .map(|(s, o)| serde_json::json!([s, o]))
            .collect();
        let rows: Vec<TotalRow> = sqlx::query_as(
            "SELECT c.key, c.window_size, c.window_start, c.count
             FROM json_each(?2) AS w
             JOIN swin_counters c ON c.namespace = ?1 AND c.window_size = w.value ->> 0
              AND c.window_start >= w.value ->> 1",
        )
        .bind(namespace)
        .bind(serde_json::Value::Array(w).to_string())
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        totals(rows)
    }

    async fn push_tats(&self, namespace: &str, push: TatPush<'_>) -> Result<Vec<Tat>, StoreError> {
        let advances = normalize_advances(push.advances);
        let rows: Vec<serde_json::Value> = advances
            .iter()
            .map(|a| serde_json::json!([a.key.as_str(), a.ns]))
            .collect();
        let batch = serde_json::Value::Array(rows).to_string();
        let mut tx = self.pool.begin().await.map_err(err)?;
        if let Some(seq) = push.seq {
            if !record_push(&mut tx, push.node_id.as_str(), namespace, seq).await? {
                tx.rollback().await.map_err(err)?;
                let keys: Vec<CompactString> = advances.into_iter().map(|a| a.key).collect();
                return self.read_tats(namespace, &keys).await;
            }
        }
        let out: Vec<TatRow> = sqlx::query_as(
            "INSERT INTO swin_buckets (namespace, key, tat_ns)
             SELECT ?1, value ->> 0, ?3 + (value ->> 1) FROM json_each(?2) WHERE true
             ON CONFLICT (namespace, key)
             DO UPDATE SET tat_ns = max(tat_ns, ?3) + (excluded.tat_ns - ?3), updated_at = unixepoch()
             RETURNING key, tat_ns",
        )
        .bind(namespace)
        .bind(&batch)
        .bind(push.now_ns)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(tats(out))
    }

    async fn read_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> Result<Vec<Tat>, StoreError> {
        let wanted: Vec<&str> = keys.iter().map(CompactString::as_str).collect();
        let rows: Vec<TatRow> = sqlx::query_as(
            "SELECT b.key, b.tat_ns FROM json_each(?2) AS r
             CROSS JOIN swin_buckets b WHERE b.namespace = ?1 AND b.key = r.value",
        )
        .bind(namespace)
        .bind(serde_json::to_string(&wanted).unwrap_or_default())
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        Ok(tats(rows))
    }

    async fn load_tats(&self, namespace: &str, now_ns: i64) -> Result<Vec<Tat>, StoreError> {
        let rows: Vec<TatRow> = sqlx::query_as(
            "SELECT key, tat_ns FROM swin_buckets WHERE namespace = ?1 AND tat_ns > ?2",
        )
        .bind(namespace)
        .bind(now_ns)
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        Ok(tats(rows))
    }

    async fn reset(
        &self,
        namespace: &str,
        key: &str,
        _window_sizes: &[u32],
    ) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await.map_err(err)?;
        for table in ["swin_counters", "swin_buckets", "swin_reservations"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE namespace = ?1 AND key = ?2"
            ))
            .bind(namespace)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(())
    }

    async fn purge(&self, now: UnixMs) -> Result<u64, StoreError> {
        // SQLite serialises writers anyway: whichever node gets the lock purges.
        let deleted =
            sqlx::query("DELETE FROM swin_counters WHERE window_start < ?1 - 2 * window_size")
                .bind(now.secs())
                .execute(&self.pool)
                .await
                .map_err(err)?
                .rows_affected();
        let full = sqlx::query("DELETE FROM swin_buckets WHERE tat_ns < ?1")
            .bind(now.0.saturating_sub(60_000).saturating_mul(1_000_000))
            .execute(&self.pool)
            .await
            .map_err(err)?
            .rows_affected();
        sqlx::query("DELETE FROM swin_holds WHERE window_start < ?1 - 2 * window_size")
            .bind(now.secs())
            .execute(&self.pool)
            .await
            .map_err(err)?;
        sqlx::query("DELETE FROM swin_reservations WHERE horizon_end_ns < ?1")
            .bind(now.0.saturating_sub(3_600_000).saturating_mul(1_000_000))
            .execute(&self.pool)
            .await
            .map_err(err)?;
        sqlx::query(
            "DELETE FROM swin_pushes WHERE pushed_at < ?1 - 3600
                OR (node_id LIKE '%~s' AND pushed_at < ?1 - 600)",
        )
        .bind(now.secs())
        .execute(&self.pool)
        .await
        .map_err(err)?;
        // leases, and the marks of released ones, lapsed a minute ago
        for table in ["swin_leases", "swin_lease_ends"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE expires_at < ?1"))
                .bind(now.0 - 60_000)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        }
        // demands of Envoy's quota service lapsed a minute ago
        sqlx::query("DELETE FROM swin_demands WHERE expires_at < ?1")
            .bind(now.0 - 60_000)
            .execute(&self.pool)
            .await
            .map_err(err)?;
        // runtime limits that lapsed, and changes older than a day (a node whose cursor
        // is older reads its keys' limits again)
        sqlx::query("DELETE FROM swin_key_limits WHERE expires_at < ?1")
            .bind(now.0)
            .execute(&self.pool)
            .await
            .map_err(err)?;
        let mut tx = self.pool.begin().await.map_err(err)?;
        let horizon = now.0 - crate::store::limits::LOG_KEPT_MS;
        sqlx::query(
            "UPDATE swin_key_limit_versions SET purged_through = max(purged_through,
                 coalesce((SELECT max(version) FROM swin_key_limit_log l
                           WHERE l.namespace = swin_key_limit_versions.namespace
                             AND l.changed_at < ?1), 0))",
        )
        .bind(horizon)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        sqlx::query("DELETE FROM swin_key_limit_log WHERE changed_at < ?1")
            .bind(horizon)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(deleted + full)
    }

    async fn ping(&self) -> Result<Option<UnixMs>, StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(err)?;
        // one machine: its clock is the node's
        Ok(None)
    }
}

/// Commits a change unless it is past `not_after` (SQLite's clock is the node's: a write
/// that waited for the database's lock that long is rolled back, its caller having said
/// nothing changed).
pub(super) async fn commit_by(
    tx: sqlx::Transaction<'_, sqlx::Sqlite>,
    not_after: UnixMs,
) -> Result<(), StoreError> {
    if crate::clock::system_now() > not_after {
        tx.rollback().await.map_err(err)?;
        return Err(StoreError::TooLate);
    }
    tx.commit().await.map_err(err)
}
