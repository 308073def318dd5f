//! The SQL stores' reservations (PostgreSQL, SQLite): their statements, in one dialect,
//! and the implementation both share ([`sql_reservation_store!`]).

use swin_core::UnixMs;

use super::{
    counted_from, extend_identity, extends_from, keys_from, Ended, OpenReservation, Opened,
    Opening, ReservationRecord, OPS_KEPT, OP_LEN,
};

/// The statements both SQL stores run, written in PostgreSQL's placeholders (`$n`;
/// SQLite's `?n` are these with `$` replaced:
/// [`sqlite_text`](crate::store::sql::sqlite_text)). The purge of lapsed rows is each
/// store's own. Every statement's functions are in both dialects (`substr`, `length`,
/// `LIKE`, `CASE`).
pub(crate) mod sql {
    pub const COUNT: &str = "SELECT count(*) FROM swin_cost_reservations
         WHERE namespace = $1 AND expires_at > $2 AND ended IS NULL";
    /// Written unless a live record holds the id.
    pub const OPEN: &str = "INSERT INTO swin_cost_reservations
             (namespace, id, keys, total, expires_at, counted, ops, ended, client)
         VALUES ($1, $2, $3, $4, $5, $7, '', NULL, $8)
         ON CONFLICT (namespace, id) DO UPDATE
         SET keys = excluded.keys, total = excluded.total, expires_at = excluded.expires_at,
             counted = excluded.counted, ops = '', ended = NULL, client = excluded.client
         WHERE swin_cost_reservations.expires_at <= $6";
    /// The namespace's open reservations, and the client's (`$4`), each counted up to
    /// its cap (`$3`, `$5`).
    pub const CAPS: &str = "SELECT
         (SELECT count(*) FROM (SELECT 1 FROM swin_cost_reservations
              WHERE namespace = $1 AND expires_at > $2 AND ended IS NULL LIMIT $3) n),
         (SELECT count(*) FROM (SELECT 1 FROM swin_cost_reservations
              WHERE namespace = $1 AND client = $4 AND expires_at > $2 AND ended IS NULL
              LIMIT $5) c)";
    /// Whether the live record holding the id is this opening's (`$3`: its keys).
    pub const OPEN_ALREADY: &str = "SELECT count(*) FROM swin_cost_reservations
         WHERE namespace = $1 AND id = $2 AND keys = $3 AND expires_at > $4 AND ended IS NULL";
    /// `$5`: the extend's `counted` piece, `$6`: [`MAX_COUNTED_TEXT`](super::MAX_COUNTED_TEXT),
    /// `$7`: `<op>;`, `$8`: the longest `ops` kept, `$9`: where `ops` goes on without its
    /// oldest id, `$10`: `%<identity>%`.
    pub const EXTEND: &str = "UPDATE swin_cost_reservations SET total = total + $3,
             counted = CASE WHEN length(counted || $5) <= $6
                            THEN counted || $5 ELSE counted END,
             ops = CASE WHEN length(ops) >= $8 THEN substr(ops, $9) ELSE ops END || $7
         WHERE namespace = $1 AND id = $2 AND expires_at > $4 AND ended IS NULL
               AND ops NOT LIKE $10
         RETURNING keys, total, expires_at, counted, ended, ops";
    /// The record when it holds the extend (`$4`: `%<identity>%`).
    pub const EXTENDED_ALREADY: &str =
        "SELECT keys, total, expires_at, counted, ended, ops FROM swin_cost_reservations
         WHERE namespace = $1 AND id = $2 AND expires_at > $3 AND ops LIKE $4";
    /// `$4`: the `ended` text, `$5`: the least lapse of an ended record.
    pub const TAKE: &str = "UPDATE swin_cost_reservations SET ended = $4,
             expires_at = CASE WHEN expires_at > $5 THEN expires_at ELSE $5 END
         WHERE namespace = $1 AND id = $2 AND expires_at > $3 AND ended IS NULL
         RETURNING keys, total, expires_at, counted, ended, ops";
    pub const READ: &str =
        "SELECT keys, total, expires_at, counted, ended, ops FROM swin_cost_reservations
         WHERE namespace = $1 AND id = $2 AND expires_at > $3";
}

/// What an opening `o` counted (the namespace's `open` open reservations and its
/// client's `clients`, for the caps it checks) and whether a cap refuses it (`Open`: no
/// cap does; a client of `""` has no share of its own).
pub(crate) fn refusal(o: &OpenReservation<'_>, open: i64, clients: i64) -> Opened {
    let open = o.max_open.map(|_| u64::try_from(open).unwrap_or(0));
    let client_open = o
        .max_open_per_client
        .filter(|_| !o.client.is_empty())
        .map(|_| u64::try_from(clients).unwrap_or(0));
    let reached = |n: Option<u64>, cap: Option<u64>| n.zip(cap).is_some_and(|(n, c)| n >= c);
    let opening = if reached(open, o.max_open) {
        Opening::Full
    } else if reached(client_open, o.max_open_per_client) {
        Opening::ClientFull
    } else {
        Opening::Open
    };
    Opened {
        opening,
        open,
        client_open,
    }
}

/// A cap as a SQL store's count goes up to it: 0 (nothing counted) when not checked.
pub(crate) fn sql_cap(cap: Option<u64>) -> i64 {
    cap.map_or(0, |c| i64::try_from(c).unwrap_or(i64::MAX))
}

/// The statements of [`sql`] in one store's placeholders, in the order
/// [`sql_reservation_store!`] takes them.
pub(crate) type Statements = [String; 8];

/// [`sql`]'s statements, each through `dialect` (PostgreSQL's: as they are).
pub(crate) fn statements(dialect: fn(&str) -> String) -> Statements {
    [
        sql::COUNT,
        sql::OPEN,
        sql::OPEN_ALREADY,
        sql::EXTEND,
        sql::EXTENDED_ALREADY,
        sql::TAKE,
        sql::READ,
        sql::CAPS,
    ]
    .map(dialect)
}

/// `%<identity>%`: what `ops` holds when it holds the extend `op` ([`extend_op`]; hex
/// digits only: no wildcard in it).
pub(crate) fn op_pattern(op: &str) -> Result<String, crate::StoreError> {
    match extend_identity(op) {
        Some(identity) => Ok(format!("%{identity}%")),
        None => Err(crate::StoreError::Protocol(format!(
            "{op:?} is not an operation id"
        ))),
    }
}

/// The longest `ops` text a record keeps: [`OPS_KEPT`] ids, each `<op>;` (at most
/// two [`OP_LEN`]s and `;`).
pub(crate) const OPS_TEXT: i32 = (OPS_KEPT * (2 * OP_LEN + 1)) as i32;

/// Implements [`ReservationStore`] for a SQL store (PostgreSQL, SQLite) from its own
/// pieces: `err` (its errors as [`StoreError`](crate::StoreError)s), `commit_by` (its
/// commit unless past `not_after`), `purge` (its statement deleting up to
/// [`PURGE_AT_ONCE`] of a namespace's lapsed rows, bound to the namespace, now and how
/// many), `lock` (its statement, if it needs one, that makes a client's openings wait
/// for each other until commit, bound to the namespace and the client) and the
/// statements of [`sql`] in its placeholders ([`statements`]). Each
/// change is one transaction: an open purges then writes, an extend or a take writes
/// then commits by `not_after`; one that finds its operation already applied reads it
/// back in the same transaction.
macro_rules! sql_reservation_store {
    ($store:ty, err: $err:path, commit_by: $commit_by:path, purge: $purge:expr, lock: $lock:expr, sql: $sql:expr $(,)?) => {
        // a block of its own, so that its imports stay out of the caller's module
        const _: () = {
            use swin_core::UnixMs;
            use $crate::store::reservations::{
                counted_text, is_client, keys_text, record, sql_cap, Ended, OpenReservation,
                Opened, Opening, RecordRow, ReservationRecord, ReservationStore, ENDED_KEPT_MS,
                MAX_COUNTED_TEXT, PURGE_AT_ONCE,
            };
            use $crate::StoreError;

            impl ReservationStore for $store {
                async fn open_reservations(
                    &self,
                    namespace: &str,
                    now: UnixMs,
                ) -> Result<u64, StoreError> {
                    let n: i64 = sqlx::query_scalar(&$sql[0])
                        .bind(namespace)
                        .bind(now.0)
                        .fetch_one(self.pool())
                        .await
                        .map_err($err)?;
                    Ok(u64::try_from(n).unwrap_or(0))
                }

                async fn open_reservation(
                    &self,
                    namespace: &str,
                    o: OpenReservation<'_>,
                ) -> Result<Opened, StoreError> {
                    if !is_client(o.client) {
                        return Err(StoreError::Protocol(format!(
                            "{:?} cannot name a client",
                            o.client
                        )));
                    }
                    let keys = keys_text(o.keys);
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    sqlx::query($purge)
                        .bind(namespace)
                        .bind(o.now.0)
                        .bind(PURGE_AT_ONCE)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?;
                    let already = || {
                        sqlx::query_scalar::<_, i64>(&$sql[2])
                            .bind(namespace)
                            .bind(o.id)
                            .bind(&keys)
                            .bind(o.now.0)
                    };
                    let mut counted = Opened::uncounted(Opening::Open);
                    if o.max_open.is_some() || o.max_open_per_client.is_some() {
                        // a client's openings counted one at a time: its count exact
                        if let (Some(lock), Some(_)) = ($lock, o.max_open_per_client) {
                            let lock = sqlx::query(lock).bind(namespace).bind(o.client);
                            lock.execute(&mut *tx).await.map_err($err)?;
                        }
                        // an opening sent again finds its own record, whatever the caps
                        if already().fetch_one(&mut *tx).await.map_err($err)? > 0 {
                            tx.commit().await.map_err($err)?;
                            return Ok(counted);
                        }
                        let (open, clients): (i64, i64) = sqlx::query_as(&$sql[7])
                            .bind(namespace)
                            .bind(o.now.0)
                            .bind(sql_cap(o.max_open))
                            .bind(o.client)
                            .bind(sql_cap(o.max_open_per_client))
                            .fetch_one(&mut *tx)
                            .await
                            .map_err($err)?;
                        counted = $crate::store::reservations::refusal(&o, open, clients);
                        if counted.opening != Opening::Open {
                            // the purge stays done
                            tx.commit().await.map_err($err)?;
                            return Ok(counted);
                        }
                    }
                    let written = sqlx::query(&$sql[1])
                        .bind(namespace)
                        .bind(o.id)
                        .bind(&keys)
                        .bind(o.total)
                        .bind(o.expires_at.0)
                        .bind(o.now.0)
                        .bind(counted_text(o.at, o.total))
                        .bind(o.client)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?
                        .rows_affected();
                    if written == 0 {
                        // a live record holds the id: this opening's own (sent again
                        // after its reply was lost), or another's
                        let mine = already().fetch_one(&mut *tx).await.map_err($err)? > 0;
                        counted = Opened::uncounted(match mine {
                            true => Opening::Open,
                            false => Opening::Taken,
                        });
                    }
                    tx.commit().await.map_err($err)?;
                    Ok(counted)
                }

                async fn extend_reservation(
                    &self,
                    namespace: &str,
                    id: &str,
                    op: &str,
                    more: f64,
                    at: UnixMs,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<Option<ReservationRecord>, StoreError> {
                    let pattern = $crate::store::reservations::op_pattern(op)?;
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    let row: Option<RecordRow> = sqlx::query_as(&$sql[3])
                        .bind(namespace)
                        .bind(id)
                        .bind(more)
                        .bind(now.0)
                        .bind(counted_text(at, more))
                        .bind(MAX_COUNTED_TEXT as i64)
                        .bind(format!("{op};"))
                        .bind($crate::store::reservations::OPS_TEXT)
                        .bind((2 * $crate::store::reservations::OP_LEN + 2) as i32)
                        .bind(&pattern)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    if row.is_some() {
                        $commit_by(tx, not_after).await?;
                        return record(row);
                    }
                    let again: Option<RecordRow> = sqlx::query_as(&$sql[4])
                        .bind(namespace)
                        .bind(id)
                        .bind(now.0)
                        .bind(&pattern)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    tx.commit().await.map_err($err)?;
                    record(again)
                }

                async fn take_reservation(
                    &self,
                    namespace: &str,
                    id: &str,
                    op: &str,
                    cost: f64,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<Option<ReservationRecord>, StoreError> {
                    if !$crate::store::reservations::is_op(op) {
                        return Err(StoreError::Protocol(format!(
                            "{op:?} is not an operation id"
                        )));
                    }
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    let row: Option<RecordRow> = sqlx::query_as(&$sql[5])
                        .bind(namespace)
                        .bind(id)
                        .bind(now.0)
                        .bind(Ended::text(op, cost))
                        .bind(now.0.saturating_add(ENDED_KEPT_MS))
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    if row.is_some() {
                        $commit_by(tx, not_after).await?;
                        return record(row);
                    }
                    let ended: Option<RecordRow> = sqlx::query_as(&$sql[6])
                        .bind(namespace)
                        .bind(id)
                        .bind(now.0)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    tx.commit().await.map_err($err)?;
                    record(ended)
                }

                async fn read_reservation(
                    &self,
                    namespace: &str,
                    id: &str,
                    now: UnixMs,
                ) -> Result<Option<ReservationRecord>, StoreError> {
                    let row: Option<RecordRow> = sqlx::query_as(&$sql[6])
                        .bind(namespace)
                        .bind(id)
                        .bind(now.0)
                        .fetch_optional(self.pool())
                        .await
                        .map_err($err)?;
                    record(row)
                }
            }
        };
    };
}
pub(crate) use sql_reservation_store;

/// A record as the SQL stores return it: keys (text), total, lapse, counted (text),
/// ended (text, none while open), ops (text).
pub(crate) type RecordRow = (String, f64, i64, String, Option<String>, String);

/// A SQL store's row as a record.
pub(crate) fn record(
    row: Option<RecordRow>,
) -> Result<Option<ReservationRecord>, crate::StoreError> {
    row.map(|(keys, total, expires_at, counted, ended, ops)| {
        Ok(ReservationRecord {
            keys: keys_from(&keys)?,
            total,
            expires_at: UnixMs(expires_at),
            counted: counted_from(&counted),
            ended: ended.as_deref().and_then(Ended::from_text),
            extends: extends_from(&ops),
        })
    })
    .transpose()
}
