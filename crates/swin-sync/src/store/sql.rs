//! What the two SQL stores (PostgreSQL, SQLite) share: the skeleton of their write
//! transactions ([`SqlTx`]: a push isolating the rows the store refuses, strict
//! admission's holds and grants), the settling of holds and grants on the rows read,
//! result rows turned into totals and TATs, and statements written once in PostgreSQL's
//! placeholders turned into SQLite's. Each store supplies only its statements.

use swin_core::{Diff, Tat, Total};

use super::{BoxFuture, Grant, Granted, Held, Hold, Push, Pushed, Rejected};
use crate::StoreError;

/// A statement written in PostgreSQL's placeholders (`$n`) in SQLite's (`?n`).
pub(crate) fn sqlite_text(postgres: &str) -> String {
    postgres.replace('$', "?")
}

/// One write transaction of a SQL store: each store (its dialect) supplies the
/// statements of each step; the order of the steps, the settling of holds and grants and
/// the isolation of refused rows are written once, in the functions below.
pub(crate) trait SqlTx: Send + Sized {
    /// Records the push `(node, namespace, seq)`; false when it was applied before. The
    /// first statement of its transaction.
    fn record_push<'a>(
        &'a mut self,
        node: &'a str,
        namespace: &'a str,
        seq: u64,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// Runs savepoint commands as they are.
    fn execute(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Adds `diffs` and returns the new totals.
    fn upsert<'a>(
        &'a mut self,
        namespace: &'a str,
        diffs: &'a [Diff],
    ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>>;
    /// The windows `holds` touch, each made to exist (new ones at 0) and locked against
    /// other writers, with the previous window's count and `holder`'s total beside it.
    fn lock_holds<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        holds: &'a [Hold],
    ) -> BoxFuture<'a, Result<Vec<HoldRow>, StoreError>>;
    /// The windows' new counts and `holder`'s new totals in them.
    fn write_holds<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        changed: &'a [(HoldWindow, swin_core::HoldState)],
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    /// The buckets of `keys` (sorted, distinct), each made to exist (a new one is full: a
    /// TAT long past) and locked, with `holder`'s last grant on it.
    fn lock_buckets<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        keys: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<GrantRow>, StoreError>>;
    /// The buckets' new TATs and `holder`'s records.
    fn write_grants<'a>(
        &'a mut self,
        namespace: &'a str,
        holder: &'a str,
        settled: &'a SettledGrants,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
    fn commit(self) -> BoxFuture<'static, Result<(), StoreError>>;
    fn rollback(self) -> BoxFuture<'static, Result<(), StoreError>>;
}

/// A push in `tx`: its record first, then its rows, isolating the ones the store refuses
/// (see [`isolate_rejected`]). `None`: the push was applied before and nothing was
/// written (the caller answers with the stored totals).
pub(crate) async fn push<T: SqlTx>(
    mut tx: T,
    namespace: &str,
    push: &Push<'_>,
    diffs: &[Diff],
) -> Result<Option<Pushed>, StoreError> {
    if let Some(seq) = push.seq {
        if !tx
            .record_push(push.node_id.as_str(), namespace, seq)
            .await?
        {
            tx.rollback().await?;
            return Ok(None);
        }
    }
    let pushed = isolate_rejected(&mut tx, namespace, diffs).await?;
    tx.commit().await?;
    Ok(Some(pushed))
}

/// Strict admission's holds in `tx`: the windows locked and read, every hold settled in
/// order ([`settle_holds`]), what changed written back, one commit.
pub(crate) async fn hold<T: SqlTx>(
    mut tx: T,
    namespace: &str,
    holder: &crate::Holder,
    holds: &[Hold],
) -> Result<Vec<Held>, StoreError> {
    let holder = holder.as_str();
    let rows = tx.lock_holds(namespace, holder, holds).await?;
    let (answers, changed) = settle_holds(holds, rows)?;
    if !changed.is_empty() {
        tx.write_holds(namespace, holder, &changed).await?;
    }
    tx.commit().await?;
    Ok(answers)
}

/// Strict admission's grants in `tx`: the buckets locked and read, every request settled
/// in order ([`settle_grants`]), the TATs and records written back, one commit.
pub(crate) async fn grant<T: SqlTx>(
    mut tx: T,
    namespace: &str,
    holder: &crate::Holder,
    grants: &[Grant],
) -> Result<Vec<Granted>, StoreError> {
    let holder = holder.as_str();
    let mut keys: Vec<&str> = grants.iter().map(|r| r.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let rows = tx.lock_buckets(namespace, holder, &keys).await?;
    let settled = settle_grants(grants, rows)?;
    tx.write_grants(namespace, holder, &settled).await?;
    tx.commit().await?;
    Ok(settled.answers)
}

/// Applies `diffs` in `tx`, isolating the rows the store refuses: each part is tried
/// under a savepoint, and a part that fails with a rejection
/// ([`StoreError::is_rejection`]) is rolled back to it and split in two until the refused
/// rows stand alone. Parts go in the order of `diffs` (the lock order). Any other error
/// ends the call; the caller's transaction then applies nothing.
async fn isolate_rejected<T: SqlTx>(
    tx: &mut T,
    namespace: &str,
    diffs: &[Diff],
) -> Result<Pushed, StoreError> {
    let mut out = Pushed::default();
    let mut parts: Vec<&[Diff]> = vec![diffs];
    while let Some(part) = parts.pop() {
        if part.is_empty() {
            continue;
        }
        tx.execute("SAVEPOINT swin_part").await?;
        match tx.upsert(namespace, part).await {
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

/// A window a hold touches, and its state as read under lock.
pub(crate) type HoldWindow = (swin_core::CompactString, u32, i64);

/// A window as both SQL stores read it under lock: key, size, start, its count, the
/// previous window's, the holder's total.
pub(crate) type HoldRow = (String, i64, i64, f64, f64, f64);

/// Each hold's answer, and the windows whose state changed (to write back).
type Settled = (Vec<Held>, Vec<(HoldWindow, swin_core::HoldState)>);

/// Settles `holds` in order on the states read under lock (`read`, one per window):
/// returns the answer per hold and the final state per window that changed, to write
/// back in the same transaction. A window asked twice sees the first hold's result.
fn settle_holds(holds: &[Hold], rows: Vec<HoldRow>) -> Result<Settled, StoreError> {
    let read: std::collections::HashMap<HoldWindow, swin_core::HoldState> = rows
        .into_iter()
        .map(|(key, size, start, current, previous, held)| {
            let state = swin_core::HoldState {
                current,
                previous,
                held,
            };
            ((key.into(), size as u32, start), state)
        })
        .collect();
    let mut now = read.clone();
    let mut answers = Vec::with_capacity(holds.len());
    for h in holds {
        let w = (h.key.clone(), h.window_size, h.window_start);
        let Some(s) = now.get_mut(&w) else {
            return Err(StoreError::Protocol(format!(
                "hold: window {w:?} was not read"
            )));
        };
        *s = swin_core::settle_hold(*s, h.request);
        answers.push(Held { state: *s });
    }
    let mut changed: Vec<(HoldWindow, swin_core::HoldState)> = now
        .into_iter()
        .filter(|(w, s)| read.get(w) != Some(s))
        .collect();
    changed.sort_by(|a, b| a.0.cmp(&b.0));
    Ok((answers, changed))
}

/// A bucket a grant touches, as both SQL stores read it under lock: key, TAT
/// (`None`: no bucket, it is full), the holder's last request number and grant.
pub(crate) type GrantRow = (String, Option<i64>, Option<i64>, Option<i64>);

/// What grants settle to: the answer per request, the buckets whose TAT moved
/// and the holder's record per bucket (key, number, grant, end of its horizon), to write
/// back in the same transaction.
pub(crate) struct SettledGrants {
    pub answers: Vec<Granted>,
    pub tats: Vec<(swin_core::CompactString, i64)>,
    pub records: Vec<(swin_core::CompactString, i64, i64, i64)>,
}

/// Settles `grants` in order on the buckets read under lock (one row per key). A key
/// asked twice sees the first request's result.
fn settle_grants(grants: &[Grant], rows: Vec<GrantRow>) -> Result<SettledGrants, StoreError> {
    use std::collections::BTreeMap;
    let read: BTreeMap<swin_core::CompactString, swin_core::GrantState> = rows
        .into_iter()
        .map(|(key, tat_ns, seq, granted)| {
            let state = swin_core::GrantState {
                tat_ns,
                last: seq.map(|s| (s, granted.unwrap_or(0))),
            };
            (key.into(), state)
        })
        .collect();
    let mut now = read.clone();
    let mut answers = Vec::with_capacity(grants.len());
    let mut records = BTreeMap::new();
    for r in grants {
        let Some(s) = now.get_mut(&r.key) else {
            return Err(StoreError::Protocol(format!(
                "grant: bucket {:?} was not read",
                r.key
            )));
        };
        let out = swin_core::settle_grant(*s, r.request);
        *s = out.state;
        answers.push(Granted {
            granted: out.granted,
            tat_ns: out.state.tat_ns,
        });
        let horizon_end = r.request.now_ns.saturating_add(r.request.horizon_ns);
        if let Some((seq, granted)) = out.state.last {
            records.insert(r.key.clone(), (seq, granted, horizon_end));
        }
    }
    let tats = now
        .iter()
        .filter(|(k, s)| read.get(*k).map(|r| r.tat_ns) != Some(s.tat_ns))
        .filter_map(|(k, s)| s.tat_ns.map(|t| (k.clone(), t)))
        .collect();
    let records = records
        .into_iter()
        .map(|(k, (seq, granted, end))| (k, seq, granted, end))
        .collect();
    Ok(SettledGrants {
        answers,
        tats,
        records,
    })
}
