//! Reservations of a cost (reserve, extend, commit): one record per reservation — its
//! keys, its total (the estimate and every extend since) and its lapse — so that any
//! node can extend or settle it. Every change is one atomic store operation that can be
//! applied again without changing anything more, so that a node that lost the store's
//! reply retries it and learns what the store did:
//!
//! - an opening names its id (128 random bits): an opening retried finds its own record
//!   open and answers true;
//! - an extend carries an operation id: the record keeps the last [`OPS_KEPT`] of them,
//!   and an extend whose id it holds answers the record without raising it again;
//! - a commit ends the record once, with its operation id and cost (`ended`): the record
//!   stays, ended, for [`ENDED_KEPT_MS`] (or until its lapse, if later), so that a
//!   commit retried with the same operation id gets the record again (it is the one
//!   that ended it: its settlement is its own), and any other commit learns that it was
//!   committed, and at what cost, instead of "never made".
//!
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
//! `total`, `lapse`, `counted`, `ops`, `ended`) and an index of a namespace's open ones,
//! changed only by `reservation.lua`.

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
    /// Set once a commit ended it: that commit's operation id and cost.
    pub ended: Option<Ended>,
    /// The latest extends applied to it (at most [`OPS_KEPT`]), oldest first: each one's
    /// operation id ([`extend_op`]).
    pub extends: Vec<String>,
}

impl ReservationRecord {
    /// The request that applied the extend whose identity is `identity` (the first
    /// [`OP_LEN`] digits of its operation id, see [`extend_op`]): `None` when the
    /// record holds no such extend.
    pub fn applied_by(&self, identity: &str) -> Option<&str> {
        self.extends.iter().find_map(|op| {
            let (id, by) = op.split_at_checked(OP_LEN)?;
            (id == identity).then_some(if by.is_empty() { id } else { by })
        })
    }
}

/// An extend's operation id: its identity (what makes it the same extend, sent again:
/// [`OP_LEN`] hex digits) and the request that applies it ([`new_op`]; the same as the
/// identity for an extend no other request can send again). A store applies an extend
/// once per identity and keeps the whole id: who applied it is read back
/// ([`ReservationRecord::applied_by`]).
pub fn extend_op(identity: &str, by: &str) -> String {
    format!("{identity}{by}")
}

/// The identity of an extend's operation id ([`extend_op`]), when it is one (an id of
/// [`OP_LEN`] digits alone, as records kept before, is its own identity).
pub fn extend_identity(op: &str) -> Option<&str> {
    let fine =
        (op.len() == OP_LEN || op.len() == 2 * OP_LEN) && op.bytes().all(|b| b.is_ascii_hexdigit());
    fine.then(|| &op[..OP_LEN])
}

/// A record's extends from their stored text (`<op>;` each).
pub(crate) fn extends_from(text: &str) -> Vec<String> {
    text.split(';')
        .filter(|op| extend_identity(op).is_some())
        .map(str::to_owned)
        .collect()
}

/// The commit that ended a reservation.
#[derive(Debug, Clone, PartialEq)]
pub struct Ended {
    /// Its operation id.
    pub op: String,
    /// The actual cost it settled the reservation at.
    pub cost: f64,
}

impl Ended {
    /// As the stores keep it: `<op>:<cost>`.
    pub fn text(op: &str, cost: f64) -> String {
        format!("{op}:{cost}")
    }

    /// From its stored text; `None` for an empty or unreadable one.
    pub fn from_text(text: &str) -> Option<Ended> {
        let (op, cost) = text.split_once(':')?;
        let cost: f64 = cost.parse().ok()?;
        (!op.is_empty() && cost.is_finite()).then(|| Ended {
            op: op.to_owned(),
            cost,
        })
    }
}

/// How long an ended record is kept (at least), so that a commit retried after a lost
/// answer learns what the first one did: two minutes.
pub const ENDED_KEPT_MS: i64 = 120_000;

/// How many extends' operation ids a record keeps (the latest): an extend retried after
/// as many others of the same reservation would be applied again.
pub const OPS_KEPT: usize = 64;

/// The length of an operation id: 16 hex digits.
pub const OP_LEN: usize = 16;

/// A new operation id: 64 random bits in hex.
pub fn new_op() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Whether `op` is an operation id as [`new_op`] makes them (the stores keep them in a
/// text they search: nothing else may go there).
pub fn is_op(op: &str) -> bool {
    op.len() == OP_LEN && op.bytes().all(|b| b.is_ascii_hexdigit())
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
    /// Who opens it: a short id (letters, digits, `-`, `_`, `.`), `""` for no client
    /// (counted against the namespace's cap only).
    pub client: &'a str,
    /// Open reservations the namespace may hold at most, checked now (this one would be
    /// past it: [`Opening::Full`]); `None`: not checked by this opening.
    pub max_open: Option<u64>,
    /// Open reservations the client may hold at most, checked now
    /// ([`Opening::ClientFull`]); `None`: not checked by this opening.
    pub max_open_per_client: Option<u64>,
}

/// What an opening did, and what it counted for the caps it checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub opening: Opening,
    /// The namespace's open reservations before it (up to its cap), when checked.
    pub open: Option<u64>,
    /// The client's, when checked.
    pub client_open: Option<u64>,
}

impl Opened {
    /// `opening`, nothing counted.
    pub fn uncounted(opening: Opening) -> Opened {
        Opened {
            opening,
            open: None,
            client_open: None,
        }
    }
}

/// What an opening did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// Open with these keys after the call: written now, or by an earlier attempt of
    /// the same opening whose reply was lost.
    Open,
    /// Another live record holds the id: nothing written.
    Taken,
    /// The namespace holds `max_open` open reservations: nothing written.
    Full,
    /// The client holds `max_open_per_client` of them: nothing written.
    ClientFull,
}

/// Whether `client` can name a client in a store's record and index: up to 64 of
/// letters, digits, `-`, `_`, `.`.
pub fn is_client(client: &str) -> bool {
    client.len() <= 64
        && client
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

store_calls! {
    /// The reservations side of a store.
    pub trait ReservationStore {
        /// How many reservations of the namespace are open at `now` (a gauge an operator
        /// reads).
        fn open_reservations(&self, namespace: &str, now: UnixMs) -> u64;

        /// Records an open reservation, deleting some of the namespace's lapsed ones,
        /// unless the namespace or its client holds as many open as the caps it checks
        /// allow: what it did ([`Opening`]) and what it counted. An opening sent again
        /// after its reply was lost finds its own record ([`Opening::Open`]), whatever
        /// the caps.
        fn open_reservation(&self, namespace: &str, open: OpenReservation<'_>) -> Opened;

        /// Raises an open reservation's total by `more`, counted at `at`, as the
        /// operation `op` ([`extend_op`]): its record after it, also when the record
        /// already holds an extend of the same identity (an earlier attempt was applied,
        /// by this request or another: nothing changes again, and
        /// [`ReservationRecord::applied_by`] tells which), or `None` when it is not open
        /// (committed, lapsed, never made) and holds no such extend.
        /// Past `not_after` by the store's clock nothing changes
        /// ([`StoreError::TooLate`](crate::StoreError::TooLate)).
        // each argument is a part of the one atomic operation the store applies
        #[allow(clippy::too_many_arguments)]
        fn extend_reservation(
            &self,
            namespace: &str,
            id: &str,
            op: &str,
            more: f64,
            at: UnixMs,
            now: UnixMs,
            not_after: UnixMs,
        ) -> Option<ReservationRecord>;

        /// Ends an open reservation as the commit `op` ([`is_op`]) at `cost`, and
        /// answers its record, `ended` set: to `op` for exactly one operation ever (the
        /// one that ended it, however often it asks), to that one for any other. `None`
        /// when there is no record (lapsed, never made). Past `not_after` nothing
        /// changes.
        fn take_reservation(
            &self,
            namespace: &str,
            id: &str,
            op: &str,
            cost: f64,
            now: UnixMs,
            not_after: UnixMs,
        ) -> Option<ReservationRecord>;

        /// A reservation's record, open or ended, changing nothing; `None` when there
        /// is none (lapsed, never made).
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
