//! Idempotency records on SQLite (see `store::idempotency`): a claim is one write
//! transaction whose first statement writes, so it holds the write lock while it reads
//! the record and counts the namespace's.

use std::sync::LazyLock;

use swin_core::UnixMs;

use super::{err, SqliteStore};
use crate::store::idempotency::{live, sql, sql_idempotency_store, Claim, Claimed, Row};
use crate::store::sql::sqlite_text;
use crate::StoreError;

/// The statements of [`sql`], made once: claim, take over, keep.
static TEXT: LazyLock<[String; 3]> =
    LazyLock::new(|| [sql::CLAIM, sql::TAKE_OVER, sql::KEEP].map(sqlite_text));

sql_idempotency_store! {
    SqliteStore,
    db: sqlx::Sqlite,
    err: err,
    claim: &TEXT[0],
    count: "INSERT INTO swin_idempotency_counts (namespace, records) VALUES (?1, 1)
                 ON CONFLICT (namespace) DO UPDATE SET records = records + 1
                 WHERE records < ?2 RETURNING records",
    take_over: &TEXT[1],
    keep: &TEXT[2],
    records: "SELECT count(*) FROM swin_idempotency WHERE namespace = ?1 AND expires_at > ?2",
}

impl SqliteStore {
    /// A claim, tried once more when the namespace was full and purging its lapsed
    /// records made room.
    async fn claim(&self, namespace: &str, c: Claim<'_>) -> Result<Claimed, StoreError> {
        match self.try_claim(namespace, &c).await? {
            // full: the namespace's lapsed records make room first, if it has some
            Claimed::Full if self.purge_lapsed(Some(namespace), c.now).await? > 0 => {
                self.try_claim(namespace, &c).await
            }
            claimed => Ok(claimed),
        }
    }

    async fn try_claim(&self, namespace: &str, c: &Claim<'_>) -> Result<Claimed, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        // a write first: the transaction holds the write lock from here
        if Self::insert_claim(&mut tx, namespace, c).await? {
            return Self::count_claim(tx, namespace, c).await;
        }
        let row: Option<Row> = sqlx::query_as(
            "SELECT fingerprint, held_until, expires_at, answer FROM swin_idempotency
             WHERE namespace = ?1 AND key = ?2",
        )
        .bind(namespace)
        .bind(c.key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        if let Some(found) = live(row, c.now)? {
            tx.commit().await.map_err(err)?;
            return Ok(Claimed::Found(found));
        }
        // lapsed, or held no longer: taken over
        Self::take_over(tx, namespace, c).await
    }

    /// Deletes the claim `token`'s record, if it has no answer, and takes it off its
    /// namespace's count, in one transaction.
    async fn release(&self, namespace: &str, key: &str, token: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let gone = sqlx::query(
            "DELETE FROM swin_idempotency
             WHERE namespace = ?1 AND key = ?2 AND token = ?3 AND answer IS NULL",
        )
        .bind(namespace)
        .bind(key)
        .bind(token)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        if gone > 0 {
            sqlx::query(
                "UPDATE swin_idempotency_counts SET records = max(records - 1, 0)
                 WHERE namespace = ?1",
            )
            .bind(namespace)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(gone > 0)
    }

    /// Deletes the lapsed records of `namespace` (all namespaces: `None`) and takes them
    /// off their namespaces' counts, in one transaction.
    async fn purge_lapsed(&self, namespace: Option<&str>, now: UnixMs) -> Result<u64, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let gone: Vec<(String,)> = sqlx::query_as(
            "DELETE FROM swin_idempotency
             WHERE expires_at <= ?1 AND (?2 IS NULL OR namespace = ?2) RETURNING namespace",
        )
        .bind(now.0)
        .bind(namespace)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let mut by_namespace = std::collections::BTreeMap::<&str, i64>::new();
        for (ns,) in &gone {
            *by_namespace.entry(ns).or_default() += 1;
        }
        for (ns, n) in by_namespace {
            sqlx::query(
                "UPDATE swin_idempotency_counts SET records = max(records - ?2, 0)
                 WHERE namespace = ?1",
            )
            .bind(ns)
            .bind(n)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        tx.commit().await.map_err(err)?;
        Ok(gone.len() as u64)
    }
}
