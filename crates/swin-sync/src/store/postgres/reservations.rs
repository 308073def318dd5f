//! Reservations of a cost on PostgreSQL (see `store::reservations`): one row each in
//! `swin_cost_reservations`; a commit's `UPDATE … RETURNING` ends it exactly once, an
//! extend's raises it only while it is live. A record opened
//! deletes lapsed rows that no other transaction holds (`FOR UPDATE SKIP LOCKED`); a
//! client's openings wait for each other (a transaction-scoped advisory lock on the
//! namespace and client) so that its count against its cap is exact.

use std::sync::LazyLock;

use super::{commit_by, err, PostgresStore};
use crate::store::reservations::{sql_reservation_store, statements, Statements};

/// The statements, as they are written.
static SQL: LazyLock<Statements> = LazyLock::new(|| statements(str::to_owned));

sql_reservation_store! {
    PostgresStore,
    err: err,
    commit_by: commit_by,
    purge: "DELETE FROM swin_cost_reservations WHERE (namespace, id) IN (
                 SELECT namespace, id FROM swin_cost_reservations
                 WHERE namespace = $1 AND expires_at <= $2 LIMIT $3
                 FOR UPDATE SKIP LOCKED)",
    lock: Some("SELECT pg_advisory_xact_lock(hashtextextended($1 || ':' || $2, 7226))"),
    sql: SQL,
}
