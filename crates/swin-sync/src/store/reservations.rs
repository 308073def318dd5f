//! Reservations of a cost (reserve, extend, commit): one record per open reservation —
//! its keys, its total (the estimate and every extend since) and its lapse — so that
//! any node can extend or settle it. A record is taken exactly once: by the one commit
//! that ends it, across every node; an extend raises its total only while it is open.
//! Past its lapse (the caller's `now`, store time) a record is as good as gone: it
//! answers nothing, and the next record opened in its namespace deletes it (Redis:
//! the key expires a minute after its lapse).
//!
//! A record also says where its total was counted: the time each take (the reserve's,
//! each extend's) was counted at, with its amount, so that a commit gives back the
//! unused part from the windows it was counted in, not from whatever window the commit
//! lands in.
//!
//! Layout: PostgreSQL and SQLite, `swin_cost_reservations` (one row per reservation);
//! Redis, one hash per reservation (`swin:cost-reservation:{<len>:<ns>}:<id>`: `keys`,
//! `total`, `lapse`, `counted`) and an index of a namespace's open ones, changed only by
//! `reservation.lua`.

use swin_core::UnixMs;

/// An open reservation as the store holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReservationRecord {
    /// Its keys, in the order the reserve named them.
    pub keys: Vec<String>,
    /// What it holds spent: the estimate and every extend since.
    pub total: f64,
    /// When it lapses (store time).
    pub expires_at: UnixMs,
    /// Where its total was counted: each take's time and amount, oldest first. It sums
    /// to less than `total` for a record written before it was kept, or one extended
    /// past [`MAX_COUNTED_TEXT`] (the rest counted at times unknown).
    pub counted: Vec<(UnixMs, f64)>,
}

/// A reservation to record.
#[derive(Debug, Clone, Copy)]
pub struct OpenReservation<'a> {
    pub id: &'a str,
    pub keys: &'a [String],
    pub total: f64,
    pub expires_at: UnixMs,
    pub now: UnixMs,
    /// When its estimate was counted (the take's time).
    pub at: UnixMs,
}

store_calls! {
    /// The reservations side of a store.
    pub trait ReservationStore {
        /// How many reservations of the namespace are open at `now` (a gauge an operator
        /// reads).
        fn open_reservations(&self, namespace: &str, now: UnixMs) -> u64;

        /// Records an open reservation (an id already recorded and live is left as it
        /// is and answers false), deleting some of the namespace's lapsed ones.
        fn open_reservation(&self, namespace: &str, open: OpenReservation<'_>) -> bool;

        /// Raises an open reservation's total by `more`, counted at `at`: its record
        /// after it, or `None` when it is not open (committed, lapsed, never made). Past
        /// `not_after` by the store's clock nothing changes
        /// ([`StoreError::TooLate`](crate::StoreError::TooLate)).
        fn extend_reservation(
            &self,
            namespace: &str,
            id: &str,
            more: f64,
            at: UnixMs,
            now: UnixMs,
            not_after: UnixMs,
        ) -> Option<ReservationRecord>;

        /// Ends an open reservation and answers its record: exactly one caller ever
        /// gets it. `None` when it is not open. Past `not_after` nothing changes.
        fn take_reservation(
            &self,
            namespace: &str,
            id: &str,
            now: UnixMs,
            not_after: UnixMs,
        ) -> Option<ReservationRecord>;

        /// An open reservation's record, changing nothing; `None` when it is not open.
        fn read_reservation(&self, namespace: &str, id: &str, now: UnixMs)
            -> Option<ReservationRecord>;
    }
}

/// A record's keys as the stores keep them: a JSON array of strings.
pub fn keys_text(keys: &[String]) -> String {
    serde_json::to_string(keys).unwrap_or_else(|_| "[]".into())
}

/// A record's keys from their stored text.
pub fn keys_from(text: &str) -> Result<Vec<String>, crate::StoreError> {
    serde_json::from_str(text)
        .map_err(|e| crate::StoreError::Protocol(format!("a reservation's keys: {e}")))
}

/// The longest `counted` text a record keeps: an extend past it raises the total
/// without saying where (about 90 extends, each `<ms>:<amount>;`).
pub const MAX_COUNTED_TEXT: usize = 2048;

/// One take as a record's `counted` text keeps it.
pub fn counted_text(at: UnixMs, amount: f64) -> String {
    format!("{}:{amount};", at.0)
}

/// A record's `counted` from its stored text; an unreadable piece is left out (its
/// amount then settles as one counted at a time unknown).
pub fn counted_from(text: &str) -> Vec<(UnixMs, f64)> {
    text.split(';')
        .filter_map(|piece| {
            let (at, amount) = piece.split_once(':')?;
            let amount: f64 = amount.parse().ok()?;
            Some((UnixMs(at.parse().ok()?), amount)).filter(|_| amount.is_finite())
        })
        .collect()
}

/// How many lapsed records one opening deletes at most.
pub const PURGE_AT_ONCE: i64 = 64;

/// The statements both SQL stores run, written in PostgreSQL's placeholders (`$n`;
/// SQLite's `?n` are these with `$` replaced:
/// [`sqlite_text`](crate::store::sql::sqlite_text)). The purge of lapsed rows is each
/// store's own.
pub(crate) mod sql {
    pub const COUNT: &str =
        "SELECT count(*) FROM swin_cost_reservations WHERE namespace = $1 AND expires_at > $2";
    /// Written unless a live record holds the id.
    pub const OPEN: &str =
        "INSERT INTO swin_cost_reservations (namespace, id, keys, total, expires_at, counted)
         VALUES ($1, $2, $3, $4, $5, $7)
         ON CONFLICT (namespace, id) DO UPDATE
         SET keys = excluded.keys, total = excluded.total, expires_at = excluded.expires_at,
             counted = excluded.counted
         WHERE swin_cost_reservations.expires_at <= $6";
    /// `$5`: the extend's `counted` piece, `$6`: [`MAX_COUNTED_TEXT`](super::MAX_COUNTED_TEXT).
    pub const EXTEND: &str = "UPDATE swin_cost_reservations SET total = total + $3,
             counted = CASE WHEN length(counted || $5) <= $6
                            THEN counted || $5 ELSE counted END
         WHERE namespace = $1 AND id = $2 AND expires_at > $4
         RETURNING keys, total, expires_at, counted";
    pub const TAKE: &str = "DELETE FROM swin_cost_reservations
         WHERE namespace = $1 AND id = $2 AND expires_at > $3
         RETURNING keys, total, expires_at, counted";
    pub const READ: &str = "SELECT keys, total, expires_at, counted FROM swin_cost_reservations
         WHERE namespace = $1 AND id = $2 AND expires_at > $3";
}

/// Implements [`ReservationStore`] for a SQL store (PostgreSQL, SQLite) from its own
/// pieces: `err` (its errors as [`StoreError`](crate::StoreError)s), `commit_by` (its
/// commit unless past `not_after`), `purge` (its statement deleting up to
/// [`PURGE_AT_ONCE`] of a namespace's lapsed rows, bound to the namespace, now and how
/// many) and the statements of [`sql`] in its placeholders. Each change is one
/// transaction: an open purges then writes, an extend or a take writes then commits by
/// `not_after`.
macro_rules! sql_reservation_store {
    (
        $store:ty,
        err: $err:path,
        commit_by: $commit_by:path,
        purge: $purge:expr,
        count: $count:expr,
        open: $open:expr,
        extend: $extend:expr,
        take: $take:expr,
        read: $read:expr $(,)?
    ) => {
        // a block of its own, so that its imports stay out of the caller's module
        const _: () = {
            use swin_core::UnixMs;
            use $crate::store::reservations::{
                counted_text, keys_text, record, OpenReservation, RecordRow, ReservationRecord,
                ReservationStore, MAX_COUNTED_TEXT, PURGE_AT_ONCE,
            };
            use $crate::StoreError;

            impl ReservationStore for $store {
                async fn open_reservations(
                    &self,
                    namespace: &str,
                    now: UnixMs,
                ) -> Result<u64, StoreError> {
                    let n: i64 = sqlx::query_scalar($count)
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
                ) -> Result<bool, StoreError> {
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    sqlx::query($purge)
                        .bind(namespace)
                        .bind(o.now.0)
                        .bind(PURGE_AT_ONCE)
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?;
                    let written = sqlx::query($open)
                        .bind(namespace)
                        .bind(o.id)
                        .bind(keys_text(o.keys))
                        .bind(o.total)
                        .bind(o.expires_at.0)
                        .bind(o.now.0)
                        .bind(counted_text(o.at, o.total))
                        .execute(&mut *tx)
                        .await
                        .map_err($err)?
                        .rows_affected();
                    tx.commit().await.map_err($err)?;
                    Ok(written > 0)
                }

                async fn extend_reservation(
                    &self,
                    namespace: &str,
                    id: &str,
                    more: f64,
                    at: UnixMs,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<Option<ReservationRecord>, StoreError> {
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    let row: Option<RecordRow> = sqlx::query_as($extend)
                        .bind(namespace)
                        .bind(id)
                        .bind(more)
                        .bind(now.0)
                        .bind(counted_text(at, more))
                        .bind(MAX_COUNTED_TEXT as i64)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    $commit_by(tx, not_after).await?;
                    record(row)
                }

                async fn take_reservation(
                    &self,
                    namespace: &str,
                    id: &str,
                    now: UnixMs,
                    not_after: UnixMs,
                ) -> Result<Option<ReservationRecord>, StoreError> {
                    let mut tx = self.pool().begin().await.map_err($err)?;
                    let row: Option<RecordRow> = sqlx::query_as($take)
                        .bind(namespace)
                        .bind(id)
                        .bind(now.0)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err($err)?;
                    $commit_by(tx, not_after).await?;
                    record(row)
                }

                async fn read_reservation(
                    &self,
                    namespace: &str,
                    id: &str,
                    now: UnixMs,
                ) -> Result<Option<ReservationRecord>, StoreError> {
                    let row: Option<RecordRow> = sqlx::query_as($read)
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

/// A record as the SQL stores return it: keys (text), total, lapse, counted (text).
pub(crate) type RecordRow = (String, f64, i64, String);

/// A SQL store's row as a record.
pub(crate) fn record(
    row: Option<RecordRow>,
) -> Result<Option<ReservationRecord>, crate::StoreError> {
    row.map(|(keys, total, expires_at, counted)| {
        Ok(ReservationRecord {
            keys: keys_from(&keys)?,
            total,
            expires_at: UnixMs(expires_at),
            counted: counted_from(&counted),
        })
    })
    .transpose()
}
