//! Idempotency records on PostgreSQL (see `store::idempotency`): a claim inserts its row
//! (`ON CONFLICT DO NOTHING`: of two racing claims one inserts, the other waits for it and
//! finds it) and counts it in `swin_idempotency_counts` in the same transaction, which
//! rolls back when the namespace is full; its client's share is counted in
//! `swin_idempotency_client_counts` the same way. A row found lapsed or held no longer is
//! taken over under its row lock.

use swin_core::UnixMs;

use super::{err, PostgresStore};
use crate::store::idempotency::{live, sql, sql_idempotency_store, Claim, Claimed, Row};
use crate::StoreError;

/// A claim that lost a race to a claim deleted meanwhile tries again, this often.
const TRIES: usize = 3;

sql_idempotency_store! {
    PostgresStore,
    db: sqlx::Postgres,
    err: err,
    claim: sql::CLAIM,
    // counted, if the namespace has room (its count row is locked until commit)
    count: "INSERT INTO swin_idempotency_counts AS c (namespace, records) VALUES ($1, 1)
                 ON CONFLICT (namespace) DO UPDATE SET records = c.records + 1
                 WHERE c.records < $2 RETURNING records",
    // the same for the claim's client (its count row locked until commit)
    count_client: "INSERT INTO swin_idempotency_client_counts AS c (namespace, client, records)
                 VALUES ($1, $2, 1)
                 ON CONFLICT (namespace, client) DO UPDATE SET records = c.records + 1
                 WHERE c.records < $3 RETURNING records",
    take_over: sql::TAKE_OVER,
    keep: sql::KEEP,
    records: "SELECT count(*)::int8 FROM swin_idempotency WHERE namespace = $1 AND expires_at > $2",
}

impl PostgresStore {
    /// A claim, tried again when it lost a race to a claim deleted meanwhile.
    async fn claim(&self, namespace: &str, c: Claim<'_>) -> Result<Claimed, StoreError> {
        if c.key.contains('\0') || namespace.contains('\0') {
            return Err(StoreError::Protocol(
                "PostgreSQL cannot store a key holding U+0000".into(),
            ));
        }
        let mut full = None;
        for _ in 0..TRIES {
            match self.try_claim(namespace, &c).await? {
                // full: the namespace's lapsed records make room first, if it has some
                Some(f @ (Claimed::Full | Claimed::ClientFull)) => {
                    if self.purge_lapsed(Some(namespace), c.now).await? == 0 {
                        return Ok(f);
                    }
                    full = Some(f);
                }
                Some(claimed) => return Ok(claimed),
                None => {}
            }
        }
        if let Some(f) = full {
            return Ok(f);
        }
        Err(StoreError::Protocol(format!(
            "idempotency record {:?}: claimed and released {TRIES} times in a row",
            c.key
        )))
    }

    /// One try of a claim: `None` when a racing claim's row went between two statements.
    async fn try_claim(
        &self,
        namespace: &str,
        c: &Claim<'_>,
    ) -> Result<Option<Claimed>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        if Self::insert_claim(&mut tx, namespace, c).await? {
            return Self::count_claim(tx, namespace, c).await.map(Some);
        }
        let row: Option<Row> = sqlx::query_as(
            "SELECT fingerprint, held_until, expires_at, answer FROM swin_idempotency
             WHERE namespace = $1 AND key = $2 FOR UPDATE",
        )
        .bind(namespace)
        .bind(c.key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        if row.is_none() {
            // released or purged since the insert saw it
            return Ok(None);
        }
        if let Some(found) = live(row, c.now)? {
            tx.commit().await.map_err(err)?;
            return Ok(Some(Claimed::Found(found)));
        }
        // lapsed, or held no longer: taken over under its row lock
        Self::take_over(tx, namespace, c).await.map(Some)
    }

    /// Deletes the claim `token`'s record, if it has no answer, and takes it off its
    /// namespace's count and its client's, in one statement.
    async fn release(&self, namespace: &str, key: &str, token: i64) -> Result<bool, StoreError> {
        let released: Option<i64> = sqlx::query_scalar(
            "WITH gone AS (
                 DELETE FROM swin_idempotency
                 WHERE namespace = $1 AND key = $2 AND token = $3 AND answer IS NULL
                 RETURNING namespace, client
             ), counted AS (
                 UPDATE swin_idempotency_counts c SET records = greatest(c.records - 1, 0)
                 WHERE c.namespace = $1 AND EXISTS (SELECT 1 FROM gone) RETURNING 1
             ), client_counted AS (
                 UPDATE swin_idempotency_client_counts c
                 SET records = greatest(c.records - 1, 0)
                 FROM gone WHERE c.namespace = gone.namespace AND c.client = gone.client
                 RETURNING 1
             )
             SELECT count(*)::int8 FROM gone",
        )
        .bind(namespace)
        .bind(key)
        .bind(token)
        .fetch_one(self.pool())
        .await
        .map_err(err)?;
        Ok(released.unwrap_or(0) > 0)
    }

    /// Deletes the lapsed records of `namespace` (all namespaces: `None`) and takes them
    /// off their namespaces' and clients' counts, in one statement.
    async fn purge_lapsed(&self, namespace: Option<&str>, now: UnixMs) -> Result<u64, StoreError> {
        let gone: Option<i64> = sqlx::query_scalar(
            "WITH gone AS (
                 DELETE FROM swin_idempotency
                 WHERE expires_at <= $1 AND ($2::text IS NULL OR namespace = $2)
                 RETURNING namespace, client
             ), n AS (SELECT namespace, count(*) AS n FROM gone GROUP BY namespace),
             counted AS (
                 UPDATE swin_idempotency_counts c SET records = greatest(c.records - n.n, 0)
                 FROM n WHERE c.namespace = n.namespace RETURNING 1
             ), by_client AS (
                 SELECT namespace, client, count(*) AS n FROM gone GROUP BY namespace, client
             ), client_counted AS (
                 UPDATE swin_idempotency_client_counts c
                 SET records = greatest(c.records - b.n, 0)
                 FROM by_client b WHERE c.namespace = b.namespace AND c.client = b.client
                 RETURNING 1
             )
             SELECT sum(n)::int8 FROM n",
        )
        .bind(now.0)
        .bind(namespace)
        .fetch_one(self.pool())
        .await
        .map_err(err)?;
        Ok(gone.map_or(0, |n| u64::try_from(n).unwrap_or(0)))
    }
}
