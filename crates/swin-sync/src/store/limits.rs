//! Limits set at run time, per key, kept in the namespace's store beside its counters so
//! that every node holds the same ones: the store keeps each key's limits as JSON text
//! (the node validates and reads them; the store only keeps them) and a log of the keys
//! whose limits changed, each change numbered, so a node asks only "what changed since
//! my cursor" and re-reads just those of the keys it serves.
//!
//! Layout: PostgreSQL and SQLite, the tables `swin_key_limits` (one row per key),
//! `swin_key_limit_log` (a row per change) and `swin_key_limit_versions` (a namespace's
//! last change number and how far its log was purged). Redis: per namespace a hash of
//! the limits, a sorted set of its keys (to list them in key order), a sorted set of
//! their expiry times and a stream of changes, under one hash tag (see `redis/limits.rs`).

use swin_core::UnixMs;

use crate::StoreError;

/// One key's limits as the store keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredLimit {
    pub key: String,
    /// The limits as the API took them, JSON.
    pub limits: String,
    /// When they lapse (the key's limits are then the config's again); `None`: never.
    pub expires_at: Option<UnixMs>,
    /// Who set them (the token's name, or `anonymous` without auth).
    pub set_by: String,
    pub set_at: UnixMs,
}

impl StoredLimit {
    /// Whether the limits still hold at `now`.
    pub fn live_at(&self, now: UnixMs) -> bool {
        self.expires_at.is_none_or(|t| t > now)
    }
}

/// The keys whose limits changed after a cursor, and the cursor to ask from next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitChanges {
    pub keys: Vec<String>,
    /// Opaque: a change number (PostgreSQL, SQLite) or a stream id (Redis).
    pub cursor: String,
    /// False when the log no longer reaches back to the cursor asked from (purged or
    /// trimmed): the caller must forget every key's limits it holds and read them again.
    pub complete: bool,
}

/// Changes a node reads per call at most; it asks again from the cursor for the rest.
pub const CHANGES_PER_CALL: usize = 10_000;

store_calls! {
    /// The runtime-limits side of a store. Every store implements it beside
    /// [`super::CounterStore`].
    pub trait LimitStore {
        /// Sets a key's limits (replacing any) and logs the change — unless the store's
        /// clock is past `not_after` when it would apply it ([`StoreError::TooLate`]: its
        /// caller stopped waiting and said nothing changed).
        fn put_limit(&self, namespace: &str, limit: &StoredLimit, not_after: UnixMs) -> ();

        /// Removes a key's limits, logging the change; false when it had none. Past
        /// `not_after` by the store's clock: [`StoreError::TooLate`], nothing removed.
        fn delete_limit(&self, namespace: &str, key: &str, not_after: UnixMs) -> bool;

        /// The limits of those of `keys` that have some (lapsed ones included: the caller
        /// knows the time).
        fn read_limits(&self, namespace: &str, keys: &[&str]) -> Vec<StoredLimit> where keys is empty;

        /// At most `count` keys' limits in key order after `after` (`None`: from the first),
        /// lapsed ones left out.
        fn list_limits(
            &self,
            namespace: &str,
            after: Option<&str>,
            count: usize,
            now: UnixMs,
        ) -> Vec<StoredLimit>;

        /// The keys changed after `since` (at most [`CHANGES_PER_CALL`]); `None`: no keys,
        /// only the cursor of the latest change, to start from.
        fn limit_changes(&self, namespace: &str, since: Option<&str>) -> LimitChanges;
    }
}

/// How long a change stays in the log: a node whose cursor is older (stopped, or cut
/// off from the store that long) forgets the limits it holds and reads them again.
pub const LOG_KEPT_MS: i64 = 24 * 3600 * 1000;

/// Changes kept in a Redis stream at most (trimmed approximately).
pub const LOG_KEPT_ENTRIES: usize = 100_000;

/// A `swin_key_limits` row: key, limits (JSON text), lapse time, who set them, when.
pub(crate) type LimitRow = (String, String, Option<i64>, String, i64);

pub(crate) fn from_row((key, limits, expires_at, set_by, set_at): LimitRow) -> StoredLimit {
    StoredLimit {
        key,
        limits,
        expires_at: expires_at.map(UnixMs),
        set_by,
        set_at: UnixMs(set_at),
    }
}

/// The SQL stores' numbered log, before its rows are read: given the namespace's
/// `(latest change, purged through)` row and the cursor asked from, either the answer
/// already (`Err`: the head to start from, or a cursor the log cannot serve) or the
/// change number to read the log after (`Ok`).
pub(crate) fn numbered_since(
    head: Option<(i64, i64)>,
    since: Option<&str>,
) -> Result<Result<i64, LimitChanges>, StoreError> {
    let (latest, purged) = head.unwrap_or((0, 0));
    let answer = |complete| LimitChanges {
        keys: Vec::new(),
        cursor: latest.to_string(),
        complete,
    };
    let Some(since) = since else {
        return Ok(Err(answer(true)));
    };
    let since = since
        .parse::<i64>()
        .map_err(|_| StoreError::Protocol(format!("{since:?} is not a change number")))?;
    if since < purged || since > latest {
        // numbers the purge removed after the cursor are changes this node never saw;
        // a head below the cursor is a store that lost its rows
        return Ok(Err(answer(false)));
    }
    Ok(Ok(since))
}

/// The changes of the log `rows` (number, key) read after `since`.
pub(crate) fn numbered_changes(since: i64, rows: Vec<(i64, String)>) -> LimitChanges {
    let cursor = rows.last().map_or(since, |r| r.0);
    LimitChanges {
        keys: rows.into_iter().map(|r| r.1).collect(),
        cursor: cursor.to_string(),
        complete: true,
    }
}

/// Chunks of keys a SQL store reads per statement (one JSON array each: no limit on
/// bound parameters).
pub(crate) const READ_AT_ONCE: usize = 5_000;

/// Implements [`LimitStore`] for a SQL store (PostgreSQL, SQLite) from its statements,
/// in its placeholders: `bump` (adds one to namespace `$1`'s change number and returns
/// it, locking the namespace's row until commit, so that numbers are given in commit
/// order and a reader never skips one committed late), `log` (logs key `$3` under
/// namespace `$1`'s change number `$2`, at the store's time), `put` (writes key `$2`'s
/// limits: `$3` the JSON, `$4` the lapse, `$5` who, `$6` when), `lock` (if the store needs
/// it, locks namespace `$1`'s change row before a delete, as a put's `bump` does first:
/// one order, no deadlock), `delete`, `read` (the rows of namespace `$1` whose keys are
/// in the JSON array `$2`), `list` (after key `$2`, or from the first when NULL, live at
/// `$3`, at most `$4`, in the bytes' order), `head` (the namespace's change number and
/// how far its log was purged) and `changes` (the log after `$2`, at most `$3`).
/// `storable` says whether a text can be stored (PostgreSQL's `text` cannot hold
/// U+0000): limits are not set for a key that cannot be, and such a key has none. Each
/// change is one transaction committed by `not_after`.
macro_rules! sql_limit_store {
    (
        $store:ty,
        db: $db:ty,
        err: $err:path,
        commit_by: $commit_by:path,
        storable: $storable:path,
        bump: $bump:expr,
        log: $log:expr,
        put: $put:expr,
        lock: $lock:expr,
        delete: $delete:expr,
        read: $read:expr,
        list: $list:expr,
        head: $head:expr,
        changes: $changes:expr $(,)?
    ) => {
        // a block of its own, so that its imports stay out of the caller's module
        const _: () = {
            use swin_core::UnixMs;
            use $crate::store::limits::{
                from_row, numbered_changes, numbered_since, LimitChanges, LimitRow, LimitStore,
                StoredLimit, CHANGES_PER_CALL, READ_AT_ONCE,
            };
            use $crate::StoreError;

            fn check_storable(key: &str) -> Result<(), StoreError> {
                match $storable(key) {
                    true => Ok(()),
                    false => Err(StoreError::Protocol(format!(
                        "this store cannot keep the key {key:?} (it holds U+0000)"
                    ))),
                }
            }

            impl $store {
                /// The namespace's next change number, logged for `key`, inside `tx`.
                async fn log_limit_change(
                    tx: &mut sqlx::Transaction<'static, $db>,
                    namespace: &str,
                    key: &str,
                ) -> Result<(), StoreError> {
                    let version: i64 = sqlx::query_scalar($bump)
                        .bind(namespace)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err($err)?;
                    sqlx::query($log)
                        .bind(namespace)
                        .bind(version)
                        .bind(key)
                        .execute(&mut **tx)
                        .await
                        .map_err($err)?;
                    Ok(())
                }
            }

            impl LimitStore for $store {
                async fn put_limit(
                    &self,
                    namespace: &str,
                    limit: &StoredLimit,
                    not_after: UnixMs,
                ) -> Result<(), StoreError> {
                    check_storable(&limit.key)?;
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    Self::log_limit_change(&mut tx, namespace, &limit.key).await?;
                    sqlx::query($put)
                        .bind(namespace)
                        .bind(&limit.key)
                        .bind(&limit.limits)
                        .bind(limit.expires_at.map(|t| t.0))
                        .bind(&limit.set_by)
                        .bind(limit.set_at.0)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?;
                    $commit_by(tx, not_after).await
                }

                async fn delete_limit(
                    &self,
                    namespace: &str,
                    key: &str,
                    not_after: UnixMs,
                ) -> Result<bool, StoreError> {
                    check_storable(key)?;
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    if let Some(lock) = $lock {
                        sqlx::query(lock)
                            .bind(namespace)
                            .execute(&mut *tx)
                            .await
                            .map_err($err)?;
                    }
                    let gone = sqlx::query($delete)
                        .bind(namespace)
                        .bind(key)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?
                        .rows_affected();
                    if gone == 0 {
                        return Ok(false);
                    }
                    Self::log_limit_change(&mut tx, namespace, key).await?;
                    $commit_by(tx, not_after).await?;
                    Ok(true)
                }

                async fn read_limits(
                    &self,
                    namespace: &str,
                    keys: &[&str],
                ) -> Result<Vec<StoredLimit>, StoreError> {
                    // a key the store cannot keep has no limits in it
                    let keys: Vec<&str> = keys.iter().copied().filter(|k| $storable(k)).collect();
                    let mut out = Vec::new();
                    for chunk in keys.chunks(READ_AT_ONCE) {
                        let keys = serde_json::to_string(chunk)
                            .map_err(|e| StoreError::Protocol(format!("keys as JSON: {e}")))?;
                        let rows: Vec<LimitRow> = sqlx::query_as($read)
                            .bind(namespace)
                            .bind(keys)
                            .fetch_all(self.pool())
                            .await
                            .map_err($err)?;
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
                    // after a key the store cannot keep: after the part of it before
                    // U+0000 (no key it keeps lies between the two)
                    let after = after.map(|a| match $storable(a) {
                        true => a,
                        false => a.split('\0').next().unwrap_or(""),
                    });
                    let rows: Vec<LimitRow> = sqlx::query_as($list)
                        .bind(namespace)
                        .bind(after)
                        .bind(now.0)
                        .bind(i64::try_from(count).unwrap_or(i64::MAX))
                        .fetch_all(self.pool())
                        .await
                        .map_err($err)?;
                    Ok(rows.into_iter().map(from_row).collect())
                }

                async fn limit_changes(
                    &self,
                    namespace: &str,
                    since: Option<&str>,
                ) -> Result<LimitChanges, StoreError> {
                    let head: Option<(i64, i64)> = sqlx::query_as($head)
                        .bind(namespace)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($err)?;
                    let since = match numbered_since(head, since)? {
                        Ok(since) => since,
                        Err(answer) => return Ok(answer),
                    };
                    let rows: Vec<(i64, String)> = sqlx::query_as($changes)
                        .bind(namespace)
                        .bind(since)
                        .bind(CHANGES_PER_CALL as i64)
                        .fetch_all(self.pool())
                        .await
                        .map_err($err)?;
                    Ok(numbered_changes(since, rows))
                }
            }
        };
    };
}

pub(crate) use sql_limit_store;
