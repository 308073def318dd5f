//! Idempotency records on SQLite (see `store::idempotency`): a claim is one write
//! transaction whose first statement writes, so it holds the write lock while it reads
//! the record and counts the namespace's and its client's.

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
    count_client: "INSERT INTO swin_idempotency_client_counts (namespace, client, records)
                 VALUES (?1, ?2, 1)
                 ON CONFLICT (namespace, client) DO UPDATE SET records = records + 1
                 WHERE records < ?3 RETURNING records",
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
            Claimed::Full | Claimed::ClientFull
                if self.purge_lapsed(Some(namespace), c.now).await? > 0 =>
            {
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
    /// namespace's count and its client's, in one transaction.
    async fn release(&self, namespace: &str, key: &str, token: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let gone: Option<(String,)> = sqlx::query_as(
            "DELETE FROM swin_idempotency
             WHERE namespace = ?1 AND key = ?2 AND token = ?3 AND answer IS NULL
             RETURNING client",
        )
        .bind(namespace)
        .bind(key)
        .bind(token)
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        if let Some((client,)) = &gone {
            sqlx::query(
                "UPDATE swin_idempotency_counts SET records = max(records - 1, 0)
                 WHERE namespace = ?1",
            )
            .bind(namespace)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
            Self::uncount_client(&mut tx, namespace, client, 1).await?;
        }
        tx.commit().await.map_err(err)?;
        Ok(gone.is_some())
    }

    /// Deletes the lapsed records of `namespace` (all namespaces: `None`) and takes them
    /// off their namespaces' and clients' counts, in one transaction.
    async fn purge_lapsed(&self, namespace: Option<&str>, now: UnixMs) -> Result<u64, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let gone: Vec<(String, String)> = sqlx::query_as(
            "DELETE FROM swin_idempotency
             WHERE expires_at <= ?1 AND (?2 IS NULL OR namespace = ?2)
             RETURNING namespace, client",
        )
        .bind(now.0)
        .bind(namespace)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        let mut by_namespace = std::collections::BTreeMap::<&str, i64>::new();
        let mut by_client = std::collections::BTreeMap::<(&str, &str), i64>::new();
        for (ns, client) in &gone {
            *by_namespace.entry(ns).or_default() += 1;
            *by_client.entry((ns, client)).or_default() += 1;
        }
        for ((ns, client), n) in by_client {
            Self::uncount_client(&mut tx, ns, client, n).await?;
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

    /// Takes `n` records off `client`'s count in `namespace`.
    async fn uncount_client(
        tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
        namespace: &str,
        client: &str,
        n: i64,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE swin_idempotency_client_counts SET records = max(records - ?3, 0)
             WHERE namespace = ?1 AND client = ?2",
        )
        .bind(namespace)
        .bind(client)
        .bind(n)
        .execute(&mut **tx)
        .await
        .map_err(err)?;
        Ok(())
    }
}
