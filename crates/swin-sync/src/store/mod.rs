//! The store boundary: push diffs (getting the new totals back), read totals of given
//! windows, load a namespace for warm-up, purge expired windows, ping. Three stores
//! implement it, dispatched by an enum; `Faulty` wraps one to inject failures.

mod faulty;
mod postgres;
mod redis;
mod sqlite;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

pub use self::faulty::{Fault, FaultyStore};
pub use self::postgres::PostgresStore;
pub use self::redis::RedisStore;
pub use self::sqlite::SqliteStore;
use swin_core::{Advance, CompactString, Diff, Tat, Total, UnixMs};

use crate::StoreError;

/// One key's window, to read its total.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WindowKey {
    pub key: CompactString,
    pub window_size: u32,
    pub window_start: i64,
}

impl WindowKey {
    /// The window a diff counts in.
    pub fn of(d: &Diff) -> Self {
        WindowKey {
            key: d.key.clone(),
            window_size: d.window_size,
            window_start: d.window_start,
        }
    }
}

/// A window a store refused for good (a count it cannot hold, a key its column cannot
/// hold): never applied, and never worth retrying.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub diff: Diff,
    pub reason: String,
}

/// What a push did: the new total of every window it applied, and the windows the store
/// refused. A push applies all but the refused windows, exactly once: one row the store
/// cannot take never holds back the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Pushed {
    pub totals: Vec<Total>,
    pub rejected: Vec<Rejected>,
}

impl From<Vec<Total>> for Pushed {
    fn from(totals: Vec<Total>) -> Self {
        Pushed {
            totals,
            rejected: Vec::new(),
        }
    }
}

/// An open transaction that a push's rows go into part by part (see
/// [`isolate_rejected`]). Each SQL store implements it over its own connection type.
pub(crate) trait PartWriter: Send {
    /// Runs savepoint commands as they are.
    fn execute(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Adds `diffs` and returns the new totals.
    fn upsert<'a>(&'a mut self, diffs: &'a [Diff])
        -> BoxFuture<'a, Result<Vec<Total>, StoreError>>;
}

/// Applies `diffs` in `tx`, isolating the rows the store refuses: each part is tried
/// under a savepoint, and a part that fails with a rejection
/// ([`StoreError::is_rejection`]) is rolled back to it and split in two until the refused
/// rows stand alone. Parts go in the order of `diffs` (the lock order). Any other error
/// ends the call; the caller's transaction then applies nothing.
pub(crate) async fn isolate_rejected(
    tx: &mut dyn PartWriter,
    diffs: &[Diff],
) -> Result<Pushed, StoreError> {
    let mut out = Pushed::default();
    let mut parts: Vec<&[Diff]> = vec![diffs];
    while let Some(part) = parts.pop() {
        if part.is_empty() {
            continue;
        }
        tx.execute("SAVEPOINT swin_part").await?;
        match tx.upsert(part).await {
            Ok(totals) => {
                tx.execute("RELEASE SAVEPOINT swin_part").await?;
                out.totals.extend(totals);
            }
            Err(e) if e.is_rejection() => {
                tx.execute("ROLLBACK TO SAVEPOINT swin_part").await?;
                tx.execute("RELEASE SAVEPOINT swin_part").await?;
                if let [one] = part {
                    out.rejected.push(Rejected {
                        diff: one.clone(),
                        reason: e.to_string(),
                    });
                } else {
                    let (first, second) = part.split_at(part.len() / 2);
                    parts.push(second);
                    parts.push(first);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// A total as the SQL stores return it: key, window size, window start, count.
pub(crate) type TotalRow = (String, i64, i64, f64);

pub(crate) fn totals(rows: Vec<TotalRow>) -> Result<Vec<Total>, StoreError> {
    rows.into_iter()
        .map(|(key, size, window_start, count)| {
            let window_size = u32::try_from(size)
                .map_err(|_| StoreError::Protocol(format!("window_size {size} out of range")))?;
            Ok(Total {
                key: key.into(),
                window_size,
                window_start,
                count,
            })
        })
        .collect()
}

/// A batch of diffs from one node. With `seq`, the store applies the batch at most once
/// per `(node_id, namespace, seq)`: the engine retries a failed push with the same
/// sequence number and the same diffs, so a push whose reply was lost is not counted
/// twice. Without `seq` (synchronous increments) there is no such record: a synchronous
/// round trip that the store applied but whose reply timed out leaves its hits counted
/// locally as well (the fallback), and the next sync pushes them again — those hits count
/// twice. Losing acknowledged hits instead would be worse; a store that answers within
/// `store_timeout` never gets there.
#[derive(Debug, Clone, Copy)]
pub struct Push<'a> {
    pub node_id: &'a str,
    pub seq: Option<u64>,
    pub diffs: &'a [Diff],
}

/// A batch of GCRA TAT advances from one node, applied at `now_ns` as
/// `tat = max(tat, now) + Σ advances`, at most once per `(node_id, namespace, seq)` like
/// [`Push`] (the two share the namespace's sequence numbers).
#[derive(Debug, Clone, Copy)]
pub struct TatPush<'a> {
    pub node_id: &'a str,
    pub seq: Option<u64>,
    pub now_ns: i64,
    pub advances: &'a [Advance],
}

/// A TAT as the SQL stores return it.
pub(crate) type TatRow = (String, i64);

pub(crate) fn tats(rows: Vec<TatRow>) -> Vec<Tat> {
    rows.into_iter()
        .map(|(key, tat_ns)| Tat {
            key: key.into(),
            tat_ns,
        })
        .collect()
}

/// Sums advances per key, in key order (the lock order, as for diffs).
pub(crate) fn normalize_advances(advances: &[Advance]) -> Vec<Advance> {
    let mut sums: BTreeMap<&str, i64> = BTreeMap::new();
    for a in advances {
        let s = sums.entry(a.key.as_str()).or_default();
        *s = s.saturating_add(a.ns);
    }
    sums.into_iter()
        .map(|(key, ns)| Advance {
            key: key.into(),
            ns,
        })
        .collect()
}

#[derive(Debug, Clone)]
pub enum Store {
    Postgres(PostgresStore),
    Redis(RedisStore),
    Sqlite(SqliteStore),
    Faulty(std::sync::Arc<FaultyStore>),
}

pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Store {
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Postgres(_) => "postgres",
            Store::Redis(_) => "redis",
            Store::Sqlite(_) => "sqlite",
            Store::Faulty(f) => f.inner().kind(),
        }
    }

    /// Whether concurrent calls already share round trips (Redis pipelines every command
    /// of the node over one connection), so synchronous increments need no queue of their
    /// own; PostgreSQL and SQLite take a pooled connection and a transaction per call.
    pub fn pipelines(&self) -> bool {
        self.kind() == "redis"
    }

    /// Applies the schema (PostgreSQL, SQLite); nothing to do for Redis.
    pub fn migrate(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.migrate().await,
                Store::Redis(_) => Ok(()),
                Store::Sqlite(s) => s.migrate().await,
                Store::Faulty(f) => f.inner().migrate().await,
            }
        })
    }

    /// Adds the diffs and returns the new total of every pushed window; windows the
    /// store refuses for good come back in [`Pushed::rejected`], the rest are applied
    /// atomically. A stored count never goes below zero: a diff that would take it
    /// there leaves 0 (refunds on several nodes cannot make quota).
    pub fn push<'a>(
        &'a self,
        namespace: &'a str,
        push: Push<'a>,
    ) -> BoxFuture<'a, Result<Pushed, StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.push(namespace, push).await,
                Store::Redis(s) => s.push(namespace, push).await,
                Store::Sqlite(s) => s.push(namespace, push).await,
                Store::Faulty(f) => f.push(namespace, push).await,
            }
        })
    }

    /// Totals of the given windows; windows the store has never seen are left out.
    pub fn read<'a>(
        &'a self,
        namespace: &'a str,
        keys: &'a [WindowKey],
    ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            match self {
                Store::Postgres(s) => s.read(namespace, keys).await,
                Store::Redis(s) => s.read(namespace, keys).await,
                Store::Sqlite(s) => s.read(namespace, keys).await,
                Store::Faulty(f) => f.read(namespace, keys).await,
            }
        })
    }

    /// Every total of the namespace in windows of the given sizes starting at or after
    /// the paired start (a node's warm-up, Kong's `fetch`).
    pub fn load_namespace<'a>(
        &'a self,
        namespace: &'a str,
        windows: &'a [(u32, i64)],
    ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.load_namespace(namespace, windows).await,
                Store::Redis(s) => s.load_namespace(namespace, windows).await,
                Store::Sqlite(s) => s.load_namespace(namespace, windows).await,
                Store::Faulty(f) => f.inner().load_namespace(namespace, windows).await,
            }
        })
    }

    /// Deletes windows that ended more than one window ago, and old push records.
    /// Returns the rows deleted (0 where the store expires keys by itself).
    pub fn purge(&self, now: UnixMs) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.purge(now).await,
                Store::Redis(_) => Ok(0),
                Store::Sqlite(s) => s.purge(now).await,
                Store::Faulty(f) => f.inner().purge(now).await,
            }
        })
    }

    /// Applies TAT advances atomically and returns the new TAT of every pushed bucket.
    pub fn push_tats<'a>(
        &'a self,
        namespace: &'a str,
        push: TatPush<'a>,
    ) -> BoxFuture<'a, Result<Vec<Tat>, StoreError>> {
        Box::pin(async move {
            if push.advances.is_empty() {
                return Ok(Vec::new());
            }
            match self {
                Store::Postgres(s) => s.push_tats(namespace, push).await,
                Store::Redis(s) => s.push_tats(namespace, push).await,
                Store::Sqlite(s) => s.push_tats(namespace, push).await,
                Store::Faulty(f) => f.push_tats(namespace, push).await,
            }
        })
    }

    /// TATs of the given buckets; buckets the store does not hold (full) are left out.
    pub fn read_tats<'a>(
        &'a self,
        namespace: &'a str,
        keys: &'a [CompactString],
    ) -> BoxFuture<'a, Result<Vec<Tat>, StoreError>> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            match self {
                Store::Postgres(s) => s.read_tats(namespace, keys).await,
                Store::Redis(s) => s.read_tats(namespace, keys).await,
                Store::Sqlite(s) => s.read_tats(namespace, keys).await,
                Store::Faulty(f) => f.inner().read_tats(namespace, keys).await,
            }
        })
    }

    /// Every bucket of the namespace that is not full at `now_ns` (warm-up).
    pub fn load_tats<'a>(
        &'a self,
        namespace: &'a str,
        now_ns: i64,
    ) -> BoxFuture<'a, Result<Vec<Tat>, StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.load_tats(namespace, now_ns).await,
                Store::Redis(s) => s.load_tats(namespace, now_ns).await,
                Store::Sqlite(s) => s.load_tats(namespace, now_ns).await,
                Store::Faulty(f) => f.inner().load_tats(namespace, now_ns).await,
            }
        })
    }

    /// Deletes a key's counters (of the given window sizes) and its bucket: a reset
    /// across the cluster.
    pub fn reset<'a>(
        &'a self,
        namespace: &'a str,
        key: &'a str,
        window_sizes: &'a [u32],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.reset(namespace, key).await,
                Store::Redis(s) => s.reset(namespace, key, window_sizes).await,
                Store::Sqlite(s) => s.reset(namespace, key).await,
                Store::Faulty(f) => f.inner().reset(namespace, key, window_sizes).await,
            }
        })
    }

    pub fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            match self {
                Store::Postgres(s) => s.ping().await,
                Store::Redis(s) => s.ping().await,
                Store::Sqlite(s) => s.ping().await,
                Store::Faulty(f) => f.ping().await,
            }
        })
    }
}

/// Sums duplicate windows and sorts by key, size and start: a statement may touch a row
/// once, and every node taking row locks in the same order is what rules out deadlocks.
pub(crate) fn normalize(diffs: &[Diff]) -> Vec<Diff> {
    let mut sums: BTreeMap<(&str, u32, i64), f64> = BTreeMap::new();
    for d in diffs {
        *sums
            .entry((d.key.as_str(), d.window_size, d.window_start))
            .or_default() += d.value;
    }
    sums.into_iter()
        .map(|((key, window_size, window_start), value)| Diff {
            key: key.into(),
            window_size,
            window_start,
            value,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_sums_duplicates_in_order() {
        let d = |k: &str, s, v| Diff {
            key: k.into(),
            window_size: 60,
            window_start: s,
            value: v,
        };
        let out = normalize(&[
            d("b", 0, 1.0),
            d("a", 60, 2.0),
            d("b", 0, 3.0),
            d("a", 0, 1.0),
        ]);
        assert_eq!(out, vec![d("a", 0, 1.0), d("a", 60, 2.0), d("b", 0, 4.0)]);
    }
}
