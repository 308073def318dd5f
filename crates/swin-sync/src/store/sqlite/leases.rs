//! Concurrency leases on SQLite (see `store::leases`): the SQL stores' one
//! implementation ([`sql_lease_store!`](crate::store::leases::sql_lease_store)) in
//! SQLite's placeholders. An acquire's first statement writes, so its transaction holds
//! the write lock while it counts.

use std::sync::LazyLock;

use super::{commit_by, err, SqliteStore};
use crate::store::leases::{sql_lease_store, statements, LeaseSql};
use crate::store::sql::sqlite_text;

/// The statements, in SQLite's placeholders, made once.
static SQL: LazyLock<LeaseSql> = LazyLock::new(|| statements(sqlite_text));

/// SQLite keeps any text.
fn storable(_: &str) -> bool {
    true
}

sql_lease_store! {
    SqliteStore,
    err: err,
    commit_by: commit_by,
    storable: storable,
    // the purge that comes first takes the write lock
    lock: None::<&str>,
    // an acquire's steps one statement each (the write lock held throughout)
    acquire: None::<&str>,
    slots_end: "DELETE FROM swin_leases
                WHERE namespace = ?1 AND key = ?2 AND lease IN (SELECT value FROM json_each(?3))
                RETURNING CAST(count AS BIGINT)",
    sql: SQL,
}
