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

mod sql_store;

pub(crate) use self::sql_store::{
    op_pattern, record, refusal, sql_cap, sql_reservation_store, statements, RecordRow, Statements,
    OPS_TEXT,
};

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
    pub trait ReservationStore kept in_memory {
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
