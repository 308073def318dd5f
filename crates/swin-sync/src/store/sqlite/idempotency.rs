//! Idempotency records on SQLite (see `store::idempotency`): a claim is one write
//! transaction whose first statement writes, so it holds the write lock while it reads
//! the record and counts the namespace's.

use swin_core::UnixMs;

use super::{err, SqliteStore};
use crate::store::idempotency::{live, Claim, Claimed, IdempotencyStore, Row};
use crate::StoreError;

impl SqliteStore {
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

    async fn try_claim(&self, namespace: &str, c: &Claim<'_>) -> Result<Claimed, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        // a write first: the transaction holds the write lock from here
        let inserted = sqlx::query(
            "INSERT INTO swin_idempotency
                 (namespace, key, fingerprint, token, held_until, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
        )
        .bind(namespace)
        .bind(c.key)
        .bind(&c.fingerprint.0[..])
        .bind(c.token)
        .bind(c.held_until.0)
        .bind(c.expires_at.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?
        .rows_affected();
        if inserted == 1 {
            let room: Option<i64> = sqlx::query_scalar(
                "INSERT INTO swin_idempotency_counts (namespace, records) VALUES (?1, 1)
                 ON CONFLICT (namespace) DO UPDATE SET records = records + 1
                 WHERE records < ?2 RETURNING records",
            )
            .bind(namespace)
            .bind(i64::try_from(c.max_records).unwrap_or(i64::MAX))
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?;
            if room.is_none() || c.max_records == 0 {
                tx.rollback().await.map_err(err)?;
                return Ok(Claimed::Full);
            }
            tx.commit().await.map_err(err)?;
            return Ok(Claimed::Mine);
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
        // lapsed, or held no longer: taken over (counted already)
        sqlx::query(
            "UPDATE swin_idempotency SET fingerprint = ?3, token = ?4, held_until = ?5,
                 expires_at = ?6, answer = NULL
             WHERE namespace = ?1 AND key = ?2",
        )
        .bind(namespace)
        .bind(c.key)
        .bind(&c.fingerprint.0[..])
        .bind(c.token)
        .bind(c.held_until.0)
        .bind(c.expires_at.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        Ok(Claimed::Mine)
    }
}

impl IdempotencyStore for SqliteStore {
    async fn claim_idempotency(
        &self,
        namespace: &str,
        c: Claim<'_>,
    ) -> Result<Claimed, StoreError> {
        match self.try_claim(namespace, &c).await? {
            // full: the namespace's lapsed records make room first, if it has some
            Claimed::Full if self.purge_lapsed(Some(namespace), c.now).await? > 0 => {
                self.try_claim(namespace, &c).await
            }
            claimed => Ok(claimed),
        }
    }

    async fn keep_answer(
        &self,
        namespace: &str,
        key: &str,
        token: i64,
        answer: &[u8],
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        let kept = sqlx::query(
            "UPDATE swin_idempotency SET answer = ?4
             WHERE namespace = ?1 AND key = ?2 AND token = ?3 AND answer IS NULL
               AND expires_at > ?5",
        )
        .bind(namespace)
        .bind(key)
        .bind(token)
        .bind(answer)
        .bind(now.0)
        .execute(self.pool())
        .await
        .map_err(err)?
        .rows_affected();
        Ok(kept > 0)
    }

    async fn release_claim(
        &self,
        namespace: &str,
        key: &str,
        token: i64,
    ) -> Result<bool, StoreError> {
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

    async fn idempotency_records(&self, namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM swin_idempotency WHERE namespace = ?1 AND expires_at > ?2",
        )
        .bind(namespace)
        .bind(now.0)
        .fetch_one(self.pool())
        .await
        .map_err(err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn purge_idempotency(&self, now: UnixMs) -> Result<u64, StoreError> {
        self.purge_lapsed(None, now).await
    }
}
