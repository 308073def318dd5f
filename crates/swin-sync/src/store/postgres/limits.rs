//! Runtime limits on PostgreSQL (see `store::limits`): the SQL stores' one implementation
//! ([`sql_limit_store!`](crate::store::limits::sql_limit_store)) with PostgreSQL's
//! statements. A change bumps the namespace's change number first (locking its row
//! until commit, so numbers are given in commit order and a reader never skips one
//! committed late), logs the key at the store's time and writes or deletes its row.

use super::{commit_by, err, PostgresStore};
use crate::store::limits::sql_limit_store;

/// PostgreSQL's `text` cannot hold U+0000.
fn storable(text: &str) -> bool {
    !text.contains('\0')
}

sql_limit_store! {
    PostgresStore,
    db: sqlx::Postgres,
    err: err,
    commit_by: commit_by,
    storable: storable,
    bump: "INSERT INTO swin_key_limit_versions AS v (namespace, version) VALUES ($1, 1)
           ON CONFLICT (namespace) DO UPDATE SET version = v.version + 1
           RETURNING v.version",
    log: "INSERT INTO swin_key_limit_log (namespace, version, key) VALUES ($1, $2, $3)",
    put: "INSERT INTO swin_key_limits (namespace, key, limits, expires_at, set_by, set_at)
          VALUES ($1, $2, $3::jsonb, $4, $5, $6)
          ON CONFLICT (namespace, key) DO UPDATE SET limits = EXCLUDED.limits,
              expires_at = EXCLUDED.expires_at, set_by = EXCLUDED.set_by,
              set_at = EXCLUDED.set_at",
    lock: Some("SELECT 1 FROM swin_key_limit_versions WHERE namespace = $1 FOR UPDATE"),
    delete: "DELETE FROM swin_key_limits WHERE namespace = $1 AND key = $2",
    read: "SELECT key, limits::text, expires_at, set_by, set_at FROM swin_key_limits
           WHERE namespace = $1
             AND key IN (SELECT jsonb_array_elements_text($2::jsonb))",
    list: "SELECT key, limits::text, expires_at, set_by, set_at FROM swin_key_limits
           WHERE namespace = $1 AND ($2::text IS NULL OR key COLLATE \"C\" > $2)
             AND (expires_at IS NULL OR expires_at > $3)
           ORDER BY key COLLATE \"C\" LIMIT $4",
    head: "SELECT version, purged_through FROM swin_key_limit_versions WHERE namespace = $1",
    changes: "SELECT version, key FROM swin_key_limit_log
              WHERE namespace = $1 AND version > $2 ORDER BY version LIMIT $3",
}
