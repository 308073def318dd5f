//! The steps of a SQL store's write transaction ([`SqlTx`](super::sql::SqlTx)), written
//! once for PostgreSQL and SQLite ([`sql_tx!`]): each store gives its statements and its
//! push's two steps (the record and the rows, which its pushes outside a transaction run
//! too). Rows travel as one JSON array per statement, whatever their number (no limit on
//! bound parameters); every statement of a step is bound alike: the namespace `$1`, the
//! array `$2` and, where the step has one, the holder `$3`.

use serde_json::{json, Value};

use super::sql::{HoldWindow, SettledGrants};
use super::Hold;

/// A hold's window: `[key, window size, window start]`, once each.
pub(crate) fn hold_windows(holds: &[Hold]) -> String {
    let rows: Vec<Value> = holds
        .iter()
        .map(|h| json!([h.key.as_str(), h.window_size, h.window_start]))
        .collect();
    Value::Array(rows).to_string()
}

/// Windows whose state a hold changed: `[key, size, start, count, holder's total]`
/// (PostgreSQL reads a JSON number's text as written, with a correctly rounded parse:
/// every double comes back the same).
pub(crate) fn hold_states(changed: &[(HoldWindow, swin_core::HoldState)]) -> String {
    let rows: Vec<Value> = changed
        .iter()
        .map(|((key, size, start), s)| json!([key.as_str(), size, start, s.current, s.held]))
        .collect();
    Value::Array(rows).to_string()
}

/// Buckets whose TAT moved: `[key, TAT]`.
pub(crate) fn grant_tats(settled: &SettledGrants) -> String {
    let rows: Vec<Value> = settled
        .tats
        .iter()
        .map(|(key, tat)| json!([key.as_str(), tat]))
        .collect();
    Value::Array(rows).to_string()
}

/// The holder's record per bucket: `[key, request number, grant, end of its horizon]`.
pub(crate) fn grant_records(settled: &SettledGrants) -> String {
    let rows: Vec<Value> = settled
        .records
        .iter()
        .map(|(key, seq, granted, end)| json!([key.as_str(), seq, granted, end]))
        .collect();
    Value::Array(rows).to_string()
}

/// Implements [`SqlTx`](crate::store::sql::SqlTx) for `$tx` (a tuple struct of one
/// `sqlx::Transaction<'static, _>`) from its store's pieces: `err`, `record_push` and
/// `upsert` (the push's steps, each given the transaction) and the statements of each
/// step, bound `$1` namespace, `$2` the rows as JSON, `$3` holder:
/// `hold_rows` (every window a hold touches made to exist, at 0, and locked in key
/// order), `hold_read` (the windows, with the previous window's count and the holder's
/// total beside each), `hold_write` (the windows' new counts and the holder's totals: one
/// statement or more), `grant_rows` (every bucket made to exist and locked), `grant_read`
/// (the buckets, with the holder's last grant), `grant_tats` (the TATs
/// that moved; bound `$1`, `$2` only) and `grant_records` (the holder's records).
macro_rules! sql_tx {
    (
        $tx:ty,
        err: $err:path,
        record_push: $record_push:path,
        upsert: $upsert:path,
        hold_rows: $hold_rows:expr,
        hold_read: $hold_read:expr,
        write_holds: $write_holds:path,
        grant_rows: $grant_rows:expr,
        grant_read: $grant_read:expr,
        grant_tats: $grant_tats:expr,
        grant_records: $grant_records:expr $(,)?
    ) => {
        // a block of its own, so that its imports stay out of the caller's module
        const _: () = {
            use swin_core::{Diff, Total};
            use $crate::store::sql::{GrantRow, HoldRow, HoldWindow, SettledGrants, SqlTx};
            use $crate::store::sql_tx::{grant_records, grant_tats, hold_windows};
            use $crate::store::{BoxFuture, Hold};
            use $crate::StoreError;

            impl SqlTx for $tx {
                fn record_push<'a>(
                    &'a mut self,
                    node: &'a str,
                    namespace: &'a str,
                    seq: u64,
                ) -> BoxFuture<'a, Result<bool, StoreError>> {
                    Box::pin($record_push(&mut self.0, node, namespace, seq))
                }

                fn execute(&mut self, sql: &'static str) -> BoxFuture<'_, Result<(), StoreError>> {
                    Box::pin(async move {
                        sqlx::query(sql).execute(&mut *self.0).await.map_err($err)?;
                        Ok(())
                    })
                }

                fn upsert<'a>(
                    &'a mut self,
                    namespace: &'a str,
                    diffs: &'a [Diff],
                ) -> BoxFuture<'a, Result<Vec<Total>, StoreError>> {
                    Box::pin($upsert(&mut self.0, namespace, diffs))
                }

                fn lock_holds<'a>(
                    &'a mut self,
                    namespace: &'a str,
                    holder: &'a str,
                    holds: &'a [Hold],
                ) -> BoxFuture<'a, Result<Vec<HoldRow>, StoreError>> {
                    Box::pin(async move {
                        let windows = hold_windows(holds);
                        // the rows, made and locked (PostgreSQL; SQLite's write lock is
                        // the database's): the read below, a statement of its own, sees
                        // every hold and push that held a lock before this one
                        sqlx::query($hold_rows)
                            .bind(namespace)
                            .bind(&windows)
                            .execute(&mut *self.0)
                            .await
                            .map_err($err)?;
                        sqlx::query_as($hold_read)
                            .bind(namespace)
                            .bind(&windows)
                            .bind(holder)
                            .fetch_all(&mut *self.0)
                            .await
                            .map_err($err)
                    })
                }

                fn write_holds<'a>(
                    &'a mut self,
                    namespace: &'a str,
                    holder: &'a str,
                    changed: &'a [(HoldWindow, swin_core::HoldState)],
                ) -> BoxFuture<'a, Result<(), StoreError>> {
                    Box::pin($write_holds(&mut self.0, namespace, holder, changed))
                }

                fn lock_buckets<'a>(
                    &'a mut self,
                    namespace: &'a str,
                    holder: &'a str,
                    keys: &'a [&'a str],
                ) -> BoxFuture<'a, Result<Vec<GrantRow>, StoreError>> {
                    Box::pin(async move {
                        let keys = serde_json::to_string(keys)
                            .map_err(|e| StoreError::Protocol(format!("keys as JSON: {e}")))?;
                        sqlx::query($grant_rows)
                            .bind(namespace)
                            .bind(&keys)
                            .execute(&mut *self.0)
                            .await
                            .map_err($err)?;
                        sqlx::query_as($grant_read)
                            .bind(namespace)
                            .bind(&keys)
                            .bind(holder)
                            .fetch_all(&mut *self.0)
                            .await
                            .map_err($err)
                    })
                }

                fn write_grants<'a>(
                    &'a mut self,
                    namespace: &'a str,
                    holder: &'a str,
                    settled: &'a SettledGrants,
                ) -> BoxFuture<'a, Result<(), StoreError>> {
                    Box::pin(async move {
                        if !settled.tats.is_empty() {
                            sqlx::query($grant_tats)
                                .bind(namespace)
                                .bind(grant_tats(settled))
                                .execute(&mut *self.0)
                                .await
                                .map_err($err)?;
                        }
                        if !settled.records.is_empty() {
                            sqlx::query($grant_records)
                                .bind(namespace)
                                .bind(grant_records(settled))
                                .bind(holder)
                                .execute(&mut *self.0)
                                .await
                                .map_err($err)?;
                        }
                        Ok(())
                    })
                }

                fn commit(self) -> BoxFuture<'static, Result<(), StoreError>> {
                    Box::pin(async move { self.0.commit().await.map_err($err) })
                }

                fn rollback(self) -> BoxFuture<'static, Result<(), StoreError>> {
                    Box::pin(async move { self.0.rollback().await.map_err($err) })
                }
            }
        };
    };
}

pub(crate) use sql_tx;
