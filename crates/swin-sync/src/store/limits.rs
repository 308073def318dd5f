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
