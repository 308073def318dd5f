//! PostgreSQL store: `swin_counters`, pushed with one `INSERT … SELECT FROM unnest(…)
//! ON CONFLICT DO UPDATE … RETURNING` per batch, so thousands of rows cost one round
//! trip and the new totals come back in it. Each transaction's statements are in
//! `tx.rs`.

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use swin_core::{CompactString, Diff, Tat, Total, UnixMs};
use tracing::instrument;

use super::sql::{self, tats, totals, TatRow, TotalRow};
use super::{
    normalize, normalize_advances, Capabilities, CounterStore, Push, Pushed, StoreKind, TatPush,
    WindowKey,
};
use crate::StoreError;

mod demands;
mod idempotency;
mod leases;
mod limits;
mod reservations;
mod tx;

static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations/postgres");

/// Only one node purges at a time: a transaction-scoped advisory lock on this id.
const PURGE_LOCK: i64 = 0x7377_696e_7075_7267; // "swinpurg"

#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
}

fn err(e: sqlx::Error) -> StoreError {
    StoreError::Postgres(e)
}

/// One statement per batch. With a sequence number ($7) the push record and the upsert
/// commit together; a retry of an applied push inserts no record, so the gate is false
/// and nothing is added again (the caller then reads the totals). Rows go in key order
/// so that nodes pushing the same keys lock them in the same order: no deadlocks.
///
/// A count never goes below zero: every diff is upserted to `greatest(count + diff, 0)`,
/// a negative one (refunds, given-back hits) only where its window has a row, leaving
/// absent windows absent (0) — in one pass in key order, as a hold locks its rows
/// (negative diffs updated in a second pass, after the positive ones, deadlocked with a
/// hold of the same keys; a row the cleanup deletes between the check and the insert —
/// a window two lengths old, which no rate reads — is written at the diff). A diff of 0 is a read of its window beside the push (a
/// sync's previous windows, a synchronous hit's): no row written, no row lock taken, one
/// statement where a push and a read were two. A normalized batch holds each window
/// once, so the two never touch the same row.
const PUSH: &str = "
WITH fresh AS (
    INSERT INTO swin_pushes (node_id, namespace, seq)
    SELECT $6, $1, $7 WHERE $7::int8 IS NOT NULL
    ON CONFLICT DO NOTHING RETURNING 1),
r AS (
    SELECT * FROM unnest($2::text[], $3::int4[], $4::int8[], $5::float8[])
        AS r(key, window_size, window_start, diff)
    WHERE $7::int8 IS NULL OR EXISTS (SELECT 1 FROM fresh)),
up AS (
    INSERT INTO swin_counters AS c (namespace, key, window_size, window_start, count)
    SELECT $1, r.key, r.window_size, to_timestamp(r.window_start), r.diff
    FROM r WHERE r.diff > 0 OR (r.diff < 0 AND EXISTS (
        SELECT 1 FROM swin_counters e WHERE e.namespace = $1 AND e.key = r.key
          AND e.window_size = r.window_size AND e.window_start = to_timestamp(r.window_start)))
    ORDER BY r.key, r.window_size, r.window_start
    ON CONFLICT (namespace, key, window_size, window_start)
    DO UPDATE SET count = greatest(c.count + EXCLUDED.count, 0), updated_at = now()
    RETURNING c.key, c.window_size::int8, extract(epoch FROM c.window_start)::int8, c.count),
-- a diff of 0 adds nothing: its window is read, as it stands, without a row lock
seen AS (
    SELECT c.key, c.window_size::int8, extract(epoch FROM c.window_start)::int8, c.count
    FROM r JOIN swin_counters c ON c.namespace = $1 AND c.key = r.key
      AND c.window_size = r.window_size AND c.window_start = to_timestamp(r.window_start)
    WHERE r.diff = 0)
SELECT * FROM up UNION ALL SELECT * FROM seen";

/// Whether `(node, namespace, seq)` is new, recorded inside a transaction (the slow path
/// of a push that isolates rejected rows).
const RECORD_PUSH: &str = "INSERT INTO swin_pushes (node_id, namespace, seq) VALUES ($1, $2, $3)
    ON CONFLICT DO NOTHING";

/// TAT advances, gated like [`PUSH`]: the insert of a new bucket is `now + advance`,
/// an existing one becomes `greatest(tat, now) + advance`.
const PUSH_TATS: &str = "
WITH fresh AS (
    INSERT INTO swin_pushes (node_id, namespace, seq)
    SELECT $5, $1, $6 WHERE $6::int8 IS NOT NULL
    ON CONFLICT DO NOTHING RETURNING 1)
INSERT INTO swin_buckets AS b (namespace, key, tat_ns)
SELECT $1, r.key, $4 + r.advance
FROM unnest($2::text[], $3::int8[]) AS r(key, advance)
WHERE $6::int8 IS NULL OR EXISTS (SELECT 1 FROM fresh)
ORDER BY r.key
ON CONFLICT (namespace, key)
DO UPDATE SET tat_ns = greatest(b.tat_ns, $4) + (EXCLUDED.tat_ns - $4), updated_at = now()
RETURNING b.key, b.tat_ns";

/// Whether PostgreSQL's `text` can hold the key (it cannot hold U+0000).
fn storable(key: &str) -> bool {
    !key.contains('\0')
}

/// Runs [`PUSH`] on `conn` (the pool, or a transaction's connection).
async fn upsert<'c, E>(
    conn: E,
    namespace: &str,
    diffs: &[Diff],
    node_id: &str,
    seq: Option<u64>,
) -> Result<Vec<Total>, StoreError>
where
    E: sqlx::Executor<'c, Database = sqlx::Postgres>,
{
    let keys: Vec<&str> = diffs.iter().map(|d| d.key.as_str()).collect();
    let sizes: Vec<i32> = diffs.iter().map(|d| d.window_size as i32).collect();
    let starts: Vec<i64> = diffs.iter().map(|d| d.window_start).collect();
    let values: Vec<f64> = diffs.iter().map(|d| d.value).collect();
    let rows: Vec<TotalRow> = sqlx::query_as(PUSH)
        .bind(namespace)
        .bind(&keys)
        .bind(&sizes)
        .bind(&starts)
        .bind(&values)
        .bind(node_id)
        .bind(seq.map(|s| s as i64))
        .fetch_all(conn)
        .await
        .map_err(err)?;
    totals(rows)
}

impl PostgresStore {
    /// A pool of at most `max_connections`. Only the URL is checked here: connections
    /// are made on first use, so a node starts (degraded) while PostgreSQL is down.
    pub fn new(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::with_access(url, max_connections, &super::Access::default())
    }

    /// As [`PostgresStore::new`], with a password and a CA beside the URL (which may
    /// also say `sslmode=require` or `verify-full`, and `sslrootcert`).
    pub fn with_access(
        url: &str,
        max_connections: u32,
        access: &super::Access,
    ) -> Result<Self, StoreError> {
        let mut opts: PgConnectOptions = url.parse().map_err(err)?;
        if let Some(password) = &access.password {
            opts = opts.password(password);
        }
        if let Some(ca) = &access.ca_file {
            opts = opts.ssl_root_cert(ca);
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(std::time::Duration::from_secs(5))
            .connect_lazy_with(opts.application_name("swin"));
        Ok(PostgresStore { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    async fn begin(&self) -> Result<tx::Tx, StoreError> {
        Ok(tx::Tx(self.pool.begin().await.map_err(err)?))
    }
}

impl CounterStore for PostgresStore {
    fn kind(&self) -> StoreKind {
        StoreKind::Postgres
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // a diff of 0 in a push is a read of its window (PUSH's `seen`)
            pipelines: true,
            expires_by_itself: false,
        }
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        MIGRATOR.run(&self.pool).await?;
        Ok(())
    }

    #[instrument(skip_all, fields(namespace, rows = push.diffs.len()))]
    async fn push(&self, namespace: &str, push: Push<'_>) -> Result<Pushed, StoreError> {
        let diffs = normalize(push.diffs);
        if diffs.is_empty() {
            return Ok(Pushed::default());
        }
        let rows = match upsert(
            &self.pool,
            namespace,
            &diffs,
            push.node_id.as_str(),
            push.seq,
        )
        .await
        {
            Ok(rows) => rows,
            // the slow path: in one transaction, the push record first, then the rows
            // under savepoints, so every other row is applied once and the refused ones
            // stand alone (an applied push is only read back)
            Err(e) if e.is_rejection() => {
                match sql::push(self.begin().await?, namespace, &push, &diffs).await? {
                    Some(pushed) => return Ok(pushed),
                    None => Vec::new(),
                }
            }
            Err(e) => return Err(e),
        };
        if push.seq.is_some() && rows.is_empty() {
            // Applied by an earlier attempt (or only negative diffs on absent windows):
            // answer with the current totals.
            let windows: Vec<WindowKey> = diffs.iter().map(WindowKey::of).collect();
            return Ok(self.read(namespace, &windows).await?.into());
        }
        Ok(rows.into())
    }

    async fn read(&self, namespace: &str, keys: &[WindowKey]) -> Result<Vec<Total>, StoreError> {
        // a key `text` cannot hold is in no row: asking for it would fail the whole read
        let keys: Vec<&WindowKey> = keys.iter().filter(|w| storable(&w.key)).collect();
        let k: Vec<&str> = keys.iter().map(|w| w.key.as_str()).collect();
        let sizes: Vec<i32> = keys.iter().map(|w| w.window_size as i32).collect();
        let starts: Vec<i64> = keys.iter().map(|w| w.window_start).collect();
        let rows: Vec<TotalRow> = sqlx::query_as(
            "SELECT c.key, c.window_size::int8, extract(epoch FROM c.window_start)::int8, c.count
             FROM unnest($2::text[], $3::int4[], $4::int8[]) AS r(key, window_size, window_start)
             JOIN swin_counters c ON c.namespace = $1 AND c.key = r.key
              AND c.window_size = r.window_size AND c.window_start = to_timestamp(r.window_start)",
        )
        .bind(namespace)
        .bind(&k)
        .bind(&sizes)
        .bind(&starts)
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
        let sizes: Vec<i32> = windows.iter().map(|w| w.0 as i32).collect();
        let starts: Vec<i64> = windows.iter().map(|w| w.1).collect();
        let rows: Vec<TotalRow> = sqlx::query_as(
            "SELECT c.key, c.window_size::int8, extract(epoch FROM c.window_start)::int8, c.count
             FROM unnest($2::int4[], $3::int8[]) AS w(window_size, oldest)
             JOIN swin_counters c ON c.namespace = $1 AND c.window_size = w.window_size
              AND c.window_start >= to_timestamp(w.oldest)",
        )
        .bind(namespace)
        .bind(&sizes)
        .bind(&starts)
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        totals(rows)
    }

    async fn push_tats(&self, namespace: &str, push: TatPush<'_>) -> Result<Vec<Tat>, StoreError> {
        let advances = normalize_advances(push.advances);
        let keys: Vec<&str> = advances.iter().map(|a| a.key.as_str()).collect();
        let values: Vec<i64> = advances.iter().map(|a| a.ns).collect();
        let rows: Vec<TatRow> = sqlx::query_as(PUSH_TATS)
            .bind(namespace)
            .bind(&keys)
            .bind(&values)
            .bind(push.now_ns)
            .bind(push.node_id.as_str())
            .bind(push.seq.map(|s| s as i64))
            .fetch_all(&self.pool)
            .await
            .map_err(err)?;
        if rows.is_empty() {
            let keys: Vec<CompactString> = advances.into_iter().map(|a| a.key).collect();
            return self.read_tats(namespace, &keys).await;
        }
        Ok(tats(rows))
    }

    async fn read_tats(
        &self,
        namespace: &str,
        keys: &[CompactString],
    ) -> Result<Vec<Tat>, StoreError> {
        let k: Vec<&str> = keys
            .iter()
            .map(CompactString::as_str)
            .filter(|k| storable(k))
            .collect();
        let rows: Vec<TatRow> = sqlx::query_as(
            "SELECT key, tat_ns FROM swin_buckets WHERE namespace = $1 AND key = ANY($2)",
        )
        .bind(namespace)
        .bind(&k)
        .fetch_all(&self.pool)
        .await
        .map_err(err)?;
        Ok(tats(rows))
    }

    async fn load_tats(&self, namespace: &str, now_ns: i64) -> Result<Vec<Tat>, StoreError> {
        let rows: Vec<TatRow> = sqlx::query_as(
            "SELECT key, tat_ns FROM swin_buckets WHERE namespace = $1 AND tat_ns > $2",
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
        if !storable(key) {
            return Ok(()); // no row can hold it: nothing to delete
        }
        let mut tx = self.pool.begin().await.map_err(err)?;
        for table in ["swin_counters", "swin_buckets", "swin_reservations"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE namespace = $1 AND key = $2"
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
        let mut tx = self.pool.begin().await.map_err(err)?;
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1)")
            .bind(PURGE_LOCK)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
        if !locked {
            return Ok(0);
        }
        let now_s = now.secs();
        let deleted = sqlx::query(
            "DELETE FROM swin_counters
             WHERE window_start < to_timestamp($1) - make_interval(secs => window_size * 2)",
        )
        .bind(now_s as f64)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        // a bucket whose TAT passed a minute ago is full: the same as no row
        let full = sqlx::query("DELETE FROM swin_buckets WHERE tat_ns < $1")
            .bind(now.0.saturating_sub(60_000).saturating_mul(1_000_000))
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        sqlx::query(
            "DELETE FROM swin_holds
             WHERE window_start < to_timestamp($1) - make_interval(secs => window_size * 2)",
        )
        .bind(now_s as f64)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        // a holder asks again only within its horizon
        sqlx::query("DELETE FROM swin_reservations WHERE horizon_end_ns < $1")
            .bind(now.0.saturating_sub(3_600_000).saturating_mul(1_000_000))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        // A retry comes within seconds; an hour of push records is plenty, ten minutes
        // of a synchronous path's (`~s`: one record per round trip)
        sqlx::query(
            "DELETE FROM swin_pushes WHERE pushed_at < to_timestamp($1) - interval '1 hour'
                OR (node_id LIKE '%~s' AND pushed_at < to_timestamp($1) - interval '10 minutes')",
        )
        .bind(now_s as f64)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        // leases, marks of released ones, Envoy's quota demands, lapsed a minute ago
        for table in ["swin_leases", "swin_lease_ends", "swin_demands"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE expires_at < $1"))
                .bind(now.0 - 60_000)
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        // runtime limits that lapsed, and changes older than a day (a node whose cursor
        // is older reads its keys' limits again)
        sqlx::query("DELETE FROM swin_key_limits WHERE expires_at < $1")
            .bind(now.0)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        sqlx::query(
            "WITH d AS (DELETE FROM swin_key_limit_log WHERE changed_at < to_timestamp($1)
                        RETURNING namespace, version)
             UPDATE swin_key_limit_versions v SET purged_through = m.version
             FROM (SELECT namespace, max(version) AS version FROM d GROUP BY namespace) m
             WHERE v.namespace = m.namespace AND v.purged_through < m.version",
        )
        .bind((now.0 - crate::store::limits::LOG_KEPT_MS) as f64 / 1e3)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(deleted + full)
    }

    async fn ping(&self) -> Result<Option<UnixMs>, StoreError> {
        // clock_timestamp(), not now(): the time of the answer, not of the transaction
        let ms: i64 =
            sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8")
                .fetch_one(&self.pool)
                .await
                .map_err(err)?;
        Ok(Some(UnixMs(ms)))
    }
}

/// Commits a change unless the server's clock is past `not_after` (then rolls it back:
/// its caller stopped waiting and said nothing changed).
pub(super) async fn commit_by(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    not_after: UnixMs,
) -> Result<(), StoreError> {
    let in_time: bool =
        sqlx::query_scalar("SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 <= $1")
            .bind(not_after.0)
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?;
    if !in_time {
        tx.rollback().await.map_err(err)?;
        return Err(StoreError::TooLate);
    }
    tx.commit().await.map_err(err)
}
