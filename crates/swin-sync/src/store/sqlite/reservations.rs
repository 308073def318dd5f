//! Reservations of a cost on SQLite (see `store::reservations`): one row each in
//! `swin_cost_reservations`, each change one write transaction (the write lock), with
//! the PostgreSQL store's statements in SQLite's placeholders.

use std::sync::LazyLock;

use super::{commit_by, err, SqliteStore};
use crate::store::reservations::{sql, sql_reservation_store};
use crate::store::sql::sqlite_text;

/// The statements of [`sql`], made once: count, open, extend, take, read.
static TEXT: LazyLock<[String; 5]> =
    LazyLock::new(|| [sql::COUNT, sql::OPEN, sql::EXTEND, sql::TAKE, sql::READ].map(sqlite_text));

sql_reservation_store! {
    SqliteStore,
    err: err,
    commit_by: commit_by,
    purge: "DELETE FROM swin_cost_reservations WHERE rowid IN (
                 SELECT rowid FROM swin_cost_reservations
                 WHERE namespace = ?1 AND expires_at <= ?2 LIMIT ?3)",
    count: &TEXT[0],
    open: &TEXT[1],
    extend: &TEXT[2],
    take: &TEXT[3],
    read: &TEXT[4],
}
