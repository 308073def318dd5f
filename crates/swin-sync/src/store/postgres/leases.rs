//! Concurrency leases on PostgreSQL (see `store::leases`): the SQL stores' one
//! implementation ([`sql_lease_store!`](crate::store::leases::sql_lease_store)), an
//! acquire (and a release of slots) first taking a transaction-scoped advisory lock on
//! the key, so that two of one key never count at once.

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
    sql: SQL,
}
