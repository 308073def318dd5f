//! Runtime limits on SQLite (see `store::limits`): the SQL stores' one implementation
//! ([`sql_limit_store!`](crate::store::limits::sql_limit_store)) with SQLite's
//! statements, on the tables of the PostgreSQL store. Each change is one write
//! transaction (SQLite serialises writers, so change numbers come in commit order).

use super::{commit_by, err, SqliteStore};
use crate::store::limits::sql_limit_store;

/// SQLite keeps any text.
fn storable(_: &str) -> bool {
    true
}

sql_limit_store! {
    SqliteStore,
    db: sqlx::Sqlite,
    err: err,
    commit_by: commit_by,
    storable: storable,
    bump: "INSERT INTO swin_key_limit_versions (namespace, version) VALUES (?1, 1)
           ON CONFLICT (namespace) DO UPDATE SET version = version + 1
           RETURNING version",
    // the database's clock, in Unix milliseconds (the node's: one machine)
    log: "INSERT INTO swin_key_limit_log (namespace, version, key, changed_at)
          VALUES (?1, ?2, ?3, CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER))",
    put: "INSERT INTO swin_key_limits (namespace, key, limits, expires_at, set_by, set_at)
          VALUES (?1, ?2, ?3, ?4, ?5, ?6)
          ON CONFLICT (namespace, key) DO UPDATE SET limits = excluded.limits,
              expires_at = excluded.expires_at, set_by = excluded.set_by,
              set_at = excluded.set_at",
    // a transaction's first write takes the database's write lock
    lock: None::<&str>,
    delete: "DELETE FROM swin_key_limits WHERE namespace = ?1 AND key = ?2",
    read: "SELECT key, limits, expires_at, set_by, set_at FROM swin_key_limits
           WHERE namespace = ?1 AND key IN (SELECT value FROM json_each(?2))",
    list: "SELECT key, limits, expires_at, set_by, set_at FROM swin_key_limits
           WHERE namespace = ?1 AND (?2 IS NULL OR key > ?2)
             AND (expires_at IS NULL OR expires_at > ?3)
           ORDER BY key LIMIT ?4",
    head: "SELECT version, purged_through FROM swin_key_limit_versions WHERE namespace = ?1",
    changes: "SELECT version, key FROM swin_key_limit_log
              WHERE namespace = ?1 AND version > ?2 ORDER BY version LIMIT ?3",
}
