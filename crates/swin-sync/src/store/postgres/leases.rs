//! Concurrency leases on PostgreSQL (see `store::leases`): the SQL stores' one
//! implementation ([`sql_lease_store!`](crate::store::leases::sql_lease_store)), an
//! acquire (and a release of slots) first taking a transaction-scoped advisory lock on
//! the key, so that two of one key never count at once; then an acquire is one
//! statement (four round trips in all, with the transaction's begin and commit).

use std::sync::LazyLock;

use super::{commit_by, err, PostgresStore};
use crate::store::leases::{sql_lease_store, statements, LeaseSql};

/// The statements, as they are written.
static SQL: LazyLock<LeaseSql> = LazyLock::new(|| statements(str::to_owned));

/// PostgreSQL's `text` cannot hold U+0000.
fn storable(text: &str) -> bool {
    !text.contains('\0')
}

sql_lease_store! {
    PostgresStore,
    err: err,
    commit_by: commit_by,
    storable: storable,
    lock: Some("SELECT pg_advisory_xact_lock(hashtextextended($1 || chr(31) || $2, 0))"),
    // lapsed leases go (not this lease's own row, which the write rewrites), the live
    // ones are counted, and the lease is written if it fits (the mark of an earlier end
    // goes: it is live again); its snapshot is taken after the lock
    acquire: Some(
        "WITH gone AS (
             DELETE FROM swin_leases
             WHERE namespace = $1 AND key = $2 AND expires_at <= $3 AND lease <> $4
         ), live AS (
             SELECT coalesce(sum(count), 0)::int8 AS n, min(expires_at) AS earliest
             FROM swin_leases
             WHERE namespace = $1 AND key = $2 AND lease <> $4 AND expires_at > $3
         ), written AS (
             INSERT INTO swin_leases (namespace, key, lease, count, expires_at)
             SELECT $1, $2, $4, $5, $6 FROM live WHERE live.n + $5 <= $7
             ON CONFLICT (namespace, key, lease) DO UPDATE
             SET count = EXCLUDED.count, expires_at = EXCLUDED.expires_at
             RETURNING 1
         ), unmarked AS (
             DELETE FROM swin_lease_ends
             WHERE namespace = $1 AND key = $2 AND lease = $4
               AND EXISTS (SELECT 1 FROM written)
         )
         SELECT n, earliest, EXISTS (SELECT 1 FROM written) FROM live"
    ),
    slots_end: "DELETE FROM swin_leases
                WHERE namespace = $1 AND key = $2
                  AND lease IN (SELECT json_array_elements_text($3::json))
                RETURNING CAST(count AS BIGINT)",
    sql: SQL,
}
