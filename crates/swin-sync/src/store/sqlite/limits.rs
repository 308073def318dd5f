//! Runtime limits on SQLite (see `store::limits`): the tables of the PostgreSQL store,
//! each change one write transaction (SQLite serialises writers, so change numbers come
//! in commit order).

use swin_core::UnixMs;

use super::{commit_by, err, SqliteStore};
use crate::store::limits::{
    from_row, numbered_changes, numbered_since, LimitChanges, LimitRow, LimitStore, StoredLimit,
    CHANGES_PER_CALL,
};
use crate::StoreError;

/// Bumps the namespace's change number and logs `key` under it, inside `tx`.
async fn log_change(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    namespace: &str,
    key: &str,
    now: UnixMs,
) -> Result<(), StoreError> {
    let version: i64 = sqlx::query_scalar(
        "INSERT INTO swin_key_limit_versions (namespace, version) VALUES (?1, 1)
         ON CONFLICT (namespace) DO UPDATE SET version = version + 1
         RETURNING version",
    )
    .bind(namespace)
    .fetch_one(&mut **tx)
    .await
    .map_err(err)?;
    sqlx::query(
        "INSERT INTO swin_key_limit_log (namespace, version, key, changed_at)
         VALUES (?1, ?2, ?3, ?4)",
    )
    .bind(namespace)
    .bind(version)
    .bind(key)
    .bind(now.0)
    .execute(&mut **tx)
    .await
    .map_err(err)?;
    Ok(())
}

impl LimitStore for SqliteStore {
    async fn put_limit(
        &self,
        namespace: &str,
        limit: &StoredLimit,
        not_after: UnixMs,
    ) -> Result<(), StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        log_change(&mut tx, namespace, &limit.key, limit.set_at).await?;
        sqlx::query(
            "INSERT INTO swin_key_limits (namespace, key, limits, expires_at, set_by, set_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (namespace, key) DO UPDATE SET limits = excluded.limits,
                 expires_at = excluded.expires_at, set_by = excluded.set_by,
                 set_at = excluded.set_at",
        )
        .bind(namespace)
        .bind(&limit.key)
        .bind(&limit.limits)
        .bind(limit.expires_at.map(|t| t.0))
        .bind(&limit.set_by)
        .bind(limit.set_at.0)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        commit_by(tx, not_after).await
    }

    async fn delete_limit(
        &self,
        namespace: &str,
        key: &str,
        not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.map_err(err)?;
        let gone = sqlx::query("DELETE FROM swin_key_limits WHERE namespace = ?1 AND key = ?2")
            .bind(namespace)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        if gone == 0 {
            return Ok(false);
        }
        let now = crate::now();
        log_change(&mut tx, namespace, key, now).await?;
        commit_by(tx, not_after).await?;
        Ok(true)
    }

    async fn read_limits(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<Vec<StoredLimit>, StoreError> {
        let mut out = Vec::new();
        // one JSON array per statement, as pushes do: no limit on bound parameters
        for chunk in keys.chunks(5_000) {
            let keys = serde_json::to_string(chunk)
                .map_err(|e| StoreError::Protocol(format!("keys as JSON: {e}")))?;
            let rows: Vec<LimitRow> = sqlx::query_as(
                "SELECT key, limits, expires_at, set_by, set_at FROM swin_key_limits
                 WHERE namespace = ?1 AND key IN (SELECT value FROM json_each(?2))",
            )
            .bind(namespace)
            .bind(keys)
            .fetch_all(self.pool())
            .await
            .map_err(err)?;
            out.extend(rows.into_iter().map(from_row));
        }
        Ok(out)
    }

    async fn list_limits(
        &self,
        namespace: &str,
        after: Option<&str>,
        count: usize,
        now: UnixMs,
    ) -> Result<Vec<StoredLimit>, StoreError> {
        let rows: Vec<LimitRow> = sqlx::query_as(
            "SELECT key, limits, expires_at, set_by, set_at FROM swin_key_limits
             WHERE namespace = ?1 AND (?2 IS NULL OR key > ?2)
               AND (expires_at IS NULL OR expires_at > ?3)
             ORDER BY key LIMIT ?4",
        )
        .bind(namespace)
        .bind(after)
        .bind(now.0)
        .bind(i64::try_from(count).unwrap_or(i64::MAX))
        .fetch_all(self.pool())
        .await
        .map_err(err)?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    async fn limit_changes(
        &self,
        namespace: &str,
        since: Option<&str>,
    ) -> Result<LimitChanges, StoreError> {
        let head: Option<(i64, i64)> = sqlx::query_as(
            "SELECT version, purged_through FROM swin_key_limit_versions WHERE namespace = ?1",
        )
        .bind(namespace)
        .fetch_optional(self.pool())
        .await
        .map_err(err)?;
        let since = match numbered_since(head, since)? {
            Ok(since) => since,
            Err(answer) => return Ok(answer),
        };
        let rows: Vec<(i64, String)> = sqlx::query_as(
            "SELECT version, key FROM swin_key_limit_log
             WHERE namespace = ?1 AND version > ?2 ORDER BY version LIMIT ?3",
        )
        .bind(namespace)
        .bind(since)
        .bind(CHANGES_PER_CALL as i64)
        .fetch_all(self.pool())
        .await
        .map_err(err)?;
        Ok(numbered_changes(since, rows))
    }
}
