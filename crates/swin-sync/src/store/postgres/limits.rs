//! Runtime limits on PostgreSQL (see `store::limits`): one statement per change, which
//! bumps the namespace's change number (locking its row until commit, so numbers are
//! given in commit order and a reader never skips one committed late), logs the key and
//! writes or deletes its row.

use swin_core::UnixMs;

use super::{commit_by, err, PostgresStore};
use crate::store::limits::{
    from_row, numbered_changes, numbered_since, LimitChanges, LimitRow, LimitStore, StoredLimit,
    CHANGES_PER_CALL,
};
use crate::StoreError;

/// The next change number of namespace $1, logged for key $2.
const LOG_CHANGE: &str = "
v AS (
    INSERT INTO swin_key_limit_versions AS v (namespace, version) VALUES ($1, 1)
    ON CONFLICT (namespace) DO UPDATE SET version = v.version + 1
    RETURNING v.version),
logged AS (
    INSERT INTO swin_key_limit_log (namespace, version, key) SELECT $1, version, $2 FROM v)";

/// PostgreSQL's `text` cannot hold U+0000: such a key cannot have limits stored.
fn check_key(key: &str) -> Result<(), StoreError> {
    if key.contains('\0') {
        return Err(StoreError::Protocol(
            "PostgreSQL cannot store a key holding U+0000".into(),
        ));
    }
    Ok(())
}

impl LimitStore for PostgresStore {
    async fn put_limit(
        &self,
        namespace: &str,
        limit: &StoredLimit,
        not_after: UnixMs,
    ) -> Result<(), StoreError> {
        check_key(&limit.key)?;
        let mut tx = self.pool().begin().await.map_err(err)?;
        sqlx::query(&format!(
            "WITH {LOG_CHANGE}
             INSERT INTO swin_key_limits (namespace, key, limits, expires_at, set_by, set_at)
             SELECT $1, $2, $3::jsonb, $4, $5, $6 FROM v
             ON CONFLICT (namespace, key) DO UPDATE SET limits = EXCLUDED.limits,
                 expires_at = EXCLUDED.expires_at, set_by = EXCLUDED.set_by,
                 set_at = EXCLUDED.set_at"
        ))
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
        check_key(key)?;
        let mut tx = self.pool().begin().await.map_err(err)?;
        // the namespace's change row first, as a PUT locks it: the same order, no deadlock
        sqlx::query("SELECT 1 FROM swin_key_limit_versions WHERE namespace = $1 FOR UPDATE")
            .bind(namespace)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        let gone = sqlx::query("DELETE FROM swin_key_limits WHERE namespace = $1 AND key = $2")
            .bind(namespace)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(err)?
            .rows_affected();
        if gone == 0 {
            return Ok(false);
        }
        sqlx::query(&format!("WITH {LOG_CHANGE} SELECT 1"))
            .bind(namespace)
            .bind(key)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        commit_by(tx, not_after).await?;
        Ok(true)
    }

    async fn read_limits(
        &self,
        namespace: &str,
        keys: &[&str],
    ) -> Result<Vec<StoredLimit>, StoreError> {
        let keys: Vec<&str> = keys.iter().copied().filter(|k| !k.contains('\0')).collect();
        let rows: Vec<LimitRow> = sqlx::query_as(
            "SELECT key, limits::text, expires_at, set_by, set_at FROM swin_key_limits
             WHERE namespace = $1 AND key = ANY($2)",
        )
        .bind(namespace)
        .bind(&keys)
        .fetch_all(self.pool())
        .await
        .map_err(err)?;
        Ok(rows.into_iter().map(from_row).collect())
    }

    async fn list_limits(
        &self,
        namespace: &str,
        after: Option<&str>,
        count: usize,
        now: UnixMs,
    ) -> Result<Vec<StoredLimit>, StoreError> {
        let rows: Vec<LimitRow> = sqlx::query_as(
            "SELECT key, limits::text, expires_at, set_by, set_at FROM swin_key_limits
             WHERE namespace = $1 AND ($2::text IS NULL OR key > $2)
               AND (expires_at IS NULL OR expires_at > $3)
             ORDER BY key COLLATE \"C\" LIMIT $4",
        )
        .bind(namespace)
        .bind(after.filter(|a| !a.contains('\0')))
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
            "SELECT version, purged_through FROM swin_key_limit_versions WHERE namespace = $1",
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
             WHERE namespace = $1 AND version > $2 ORDER BY version LIMIT $3",
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
