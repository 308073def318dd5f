//! SQLite store, the embedded default: the same tables and semantics as PostgreSQL in
//! one file that several nodes on one host share (WAL). A batch travels as one JSON
//! array expanded by `json_each`, inside one write transaction.

use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use swin_core::{Total, UnixMs};

use super::{normalize, totals, Push, TotalRow, WindowKey};
use crate::StoreError;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/sqlite");

#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
}

fn err(e: sqlx::Error) -> StoreError {
    StoreError::Sqlite(e)
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

    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    pub(crate) async fn push(
        &self,
        namespace: &str,
        push: Push<'_>,
    ) -> Result<Vec<Total>, StoreError> {
        let diffs = normalize(push.diffs);
        if diffs.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<serde_json::Value> = diffs
            .iter()
            .map(|d| serde_json::json!([d.key.as_str(), d.window_size, d.window_start, d.value]))
            .collect();
        let batch = serde_json::Value::Array(rows).to_string();
        let mut tx = self.pool.begin().await.map_err(err)?;
        if let Some(seq) = push.seq {
            // The first statement writes, so the write lock is taken (waiting on
            // busy_timeout) before anything is read.
            let fresh = sqlx::query(
                "INSERT INTO swin_pushes (node_id, namespace, seq) VALUES (?1, ?2, ?3)
                 ON CONFLICT DO NOTHING",
            )
            .bind(push.node_id)
            .bind(namespace)
            .bind(seq as i64)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
            if fresh == 0 {
                tx.rollback().await.map_err(err)?;
                let windows: Vec<WindowKey> = diffs.iter().map(WindowKey::of).collect();
                return self.read(namespace, &windows).await;
            }
        }
        let out: Vec<TotalRow> = sqlx::query_as(
            "INSERT INTO swin_counters (namespace, key, window_size, window_start, count)
             SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(?2) WHERE true
             ON CONFLICT (namespace, key, window_size, window_start)
             DO UPDATE SET count = count + excluded.count, updated_at = unixepoch()
             RETURNING key, window_size, window_start, count",
        )
        .bind(namespace)
        .bind(&batch)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        totals(out)
    }

    /// `CROSS JOIN` keeps the wanted windows as the outer loop, so each is one primary
    /// key lookup; left to itself the planner may scan the table once per window.
    pub(crate) async fn read(
        &self,
        namespace: &str,
        keys: &[WindowKey],
    ) -> Result<Vec<Total>, StoreError> {
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

    pub(crate) async fn load_namespace(
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

    pub(crate) async fn purge(&self, now: UnixMs) -> Result<u64, StoreError> {
        // SQLite serialises writers anyway: whichever node gets the lock purges.
        let deleted =
            sqlx::query("DELETE FROM swin_counters WHERE window_start < ?1 - 2 * window_size")
                .bind(now.secs())
                .execute(&self.pool)
                .await
                .map_err(err)?
                .rows_affected();
        sqlx::query("DELETE FROM swin_pushes WHERE pushed_at < ?1 - 3600")
            .bind(now.secs())
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(deleted)
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(err)?;
        Ok(())
    }
}
