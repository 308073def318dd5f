//! Reservations of a cost on SQLite (see `store::reservations`): one row each in
//! `swin_cost_reservations`, each change one write transaction (the write lock), with
//! the PostgreSQL store's statements in SQLite's placeholders.

use std::sync::LazyLock;

use super::{commit_by, err, SqliteStore};
use crate::store::reservations::{sql_reservation_store, statements, Statements};
use crate::store::sql::sqlite_text;

/// The statements, in SQLite's placeholders, made once.
static SQL: LazyLock<Statements> = LazyLock::new(|| statements(sqlite_text));

sql_reservation_store! {
    SqliteStore,
    err: err,
    commit_by: commit_by,
    purge: "DELETE FROM swin_cost_reservations WHERE rowid IN (
                 SELECT rowid FROM swin_cost_reservations
                 WHERE namespace = ?1 AND expires_at <= ?2 LIMIT ?3)",
    // the purge took the write lock: openings are counted one at a time already
    lock: None::<&str>,
    sql: SQL,
}
