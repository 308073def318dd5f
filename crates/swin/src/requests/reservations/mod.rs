//! Reserve, then commit: a cost known only after the answer (an LLM's tokens, bytes
//! sent, CPU seconds) spent as an estimate first and settled at the actual cost later,
//! on window and GCRA namespaces; over one key or several at once.
//!
//! - A reserve (`reserve.rs`) is the namespace's hit of `cost = estimate` on each of
//!   its keys, all or nothing through the request pipeline (a reserve denied by one key
//!   spends nothing on any). When allowed, the reservation is recorded where the
//!   namespace keeps them (its store, so that any node can extend or settle it; a
//!   local-only namespace, this node): its keys, its total and its lapse. Its id is 128
//!   random bits in hex.
//! - An extend (`extend.rs`) adds `more` to an open reservation, decided as a hit of
//!   `more` on its keys (all or nothing): allowed, the record's total grows; denied, the
//!   reservation stays open at what it had.
//! - A commit (`commit.rs`) ends the reservation (exactly once, on every node: a commit
//!   repeated after a lost answer, or made after the ttl, is 404 `unknown_reservation`
//!   and settles nothing), then settles each key at the actual cost against the
//!   reservation's total: less is given back as a refund is (never below zero, only in
//!   windows still counted), from the current window and then from the previous one for
//!   what is left (a reservation made before a window's end and committed after it);
//!   more is charged as the namespace's `overrun` says —
//!   `"debt"` (the default) charges all of it, even past the limit, and the key's hits
//!   and reserves are then denied until its windows or bucket bring it back under;
//!   `"cap"` charges what the limits leave and reports the rest `uncharged`.
//! - A reservation not committed by its ttl stays settled at its total.
//!
//! Each runs to its end once started (a client that goes away does not cut it between
//! its steps); a settlement the store refuses after the reservation ended is retried by
//! the node until the store answers.

mod caps;
mod commit;
mod ending;
mod extend;
mod reserve;
mod settlement;

use std::time::{Duration, SystemTime};

use serde::Serialize;
use swin_core::UnixMs;

use crate::config::MIN_TTL_SECS;
use crate::decisions::{HitAnswer, Verdict};
use crate::error::Error;
use crate::policy::input::check_key;

pub(crate) use self::caps::CapChecks;
pub(crate) use self::commit::Commit;
pub(crate) use self::ending::{resume, resume_give_back, resume_settle};
pub(crate) use self::extend::{resume_extend, Extend};
pub(crate) use self::reserve::{undo, Reserve};

/// A reservation's life when the client names none.
pub(crate) const DEFAULT_RESERVATION_TTL_SECS: f64 = 30.0;
/// The longest life a reservation can ask for: a day.
pub(crate) const MAX_RESERVATION_TTL_SECS: f64 = 86_400.0;
/// The most keys one reservation holds.
pub(crate) const MAX_RESERVATION_KEYS: usize = 16;

/// How long the node keeps trying a settlement or an undo the store refused.
const RETRY_FOR: Duration = Duration::from_secs(60);
const RETRY_EVERY: Duration = Duration::from_millis(500);
/// The longest wait between two tries of a settlement or a give-back owed.
const RETRY_MOST: Duration = Duration::from_secs(5);

/// A reserve's or an extend's answer: each key's verdict, and when allowed the
/// reservation.
#[derive(Debug)]
pub struct Reserved {
    /// The strictest of the keys' verdicts (a denied one when the request was denied).
    pub(crate) verdict: Verdict,
    /// Each key's verdict, in the request's order.
    pub(crate) verdicts: Vec<(String, Verdict)>,
    /// The reservation's id and lapse time (allowed only).
    pub(crate) reservation: Option<(String, UnixMs)>,
    /// The reservation's total after it (allowed; denied: what it had, or 0 for a
    /// reserve).
    pub(crate) total: f64,
    /// The cost asked: a reserve's estimate on each key, or what an extend adds.
    pub(crate) cost: f64,
}

impl Reserved {
    /// The strictest of the keys' verdicts (a denied one when the request was denied).
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// Each key's verdict, in the request's order.
    pub fn verdicts(&self) -> &[(String, Verdict)] {
        &self.verdicts
    }

    /// The reservation's id and lapse time (allowed only).
    pub fn reservation(&self) -> Option<(&str, SystemTime)> {
        let (id, at) = self.reservation.as_ref()?;
        Some((id, crate::policy::system_time(*at)))
    }

    /// The reservation's total after it (allowed; denied: what it had, or 0 for a
    /// reserve).
    pub fn total(&self) -> f64 {
        self.total
    }

    /// The cost asked: a reserve's estimate on each key, or what an extend adds.
    pub fn cost(&self) -> f64 {
        self.cost
    }
}

/// How a commit settled one key of a reservation, a document: as it serializes, each of
/// the fields below (the daemon's answer to a commit lists them per key), and the key
/// after it (`after`) as a [`Verdict`].
#[derive(Debug, Serialize)]
pub struct Settled {
    /// True once settled (a second commit of it answers that it is unknown).
    pub(crate) committed: bool,
    /// True when another commit of the reservation (an earlier one, whose answer was
    /// lost) settled it: this answer repeats that settlement, at the cost asked (a
    /// capped overrun may have charged less), and changed nothing.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) replayed: bool,
    /// Its id.
    pub(crate) reservation: String,
    /// The key.
    pub(crate) key: String,
    /// What the reservation held spent: the estimate and every extend since.
    pub(crate) estimate: f64,
    /// The actual cost it was settled at.
    pub(crate) cost: f64,
    /// Spent beyond the estimate.
    pub(crate) charged: f64,
    /// Of the estimate, given back.
    pub(crate) given_back: f64,
    /// Of the estimate, still to give back: the store did not hold all of a take yet
    /// (counted on a node whose push had not landed); this node gives it back as it
    /// lands. Not in the answer when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub(crate) owed: f64,
    /// Beyond the estimate but not charged (`overrun = "cap"`: the limits had no room
    /// left for it).
    pub(crate) uncharged: f64,
    /// How far past its limit the key is after the settlement (0 when within it).
    pub(crate) debt: f64,
    /// The key after the settlement, as a dry run sees it.
    #[serde(flatten)]
    pub(crate) after: HitAnswer,
    /// The key after the settlement, as its verdict.
    #[serde(skip)]
    pub(crate) verdict: Verdict,
}

impl Settled {
    /// The key after the settlement, as a dry run sees it.
    pub fn after(&self) -> &Verdict {
        &self.verdict
    }
}

/// A reservation's life: `ttl` seconds if given (a millisecond ≤ ttl ≤ a day: a shorter one would lapse before it is granted), else 30.
fn reservation_ttl(ttl: Option<f64>) -> Result<Duration, Error> {
    match ttl {
        None => Ok(Duration::from_secs_f64(DEFAULT_RESERVATION_TTL_SECS)),
        Some(t) if (MIN_TTL_SECS..=MAX_RESERVATION_TTL_SECS).contains(&t) => {
            Ok(Duration::from_secs_f64(t))
        }
        Some(t) => Err(Error::BadRequest(format!(
            "ttl: {t} is not a number of seconds from {MIN_TTL_SECS} (a millisecond) to {MAX_RESERVATION_TTL_SECS}"
        ))),
    }
}

/// A reservation id as a reserve makes them: 32 hex digits. (An id of the form ids
/// had before reservations were recorded with their total, `<32 hex>.<estimate>`, is
/// taken too, and is simply not open.)
pub(crate) fn check_id(id: &str) -> Result<(), Error> {
    let (random, rest) = id.split_at(id.len().min(32));
    let hex = random.len() == 32 && random.bytes().all(|b| b.is_ascii_hexdigit());
    let old = rest.is_empty()
        || (rest.len() <= 32
            && rest.starts_with('.')
            && rest[1..].bytes().all(|b| b.is_ascii_digit() || b == b'.'));
    if hex && old {
        return Ok(());
    }
    Err(Error::BadRequest(
        "reservation: not a reservation id (the id a reserve answered: 32 hex digits)".into(),
    ))
}

/// A new reservation id: 128 random bits in hex.
fn new_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The keys of a reservation over several: 1 to [`MAX_RESERVATION_KEYS`], each a key,
/// none twice; errors name the field (`keys`, `keys[i]`).
pub(crate) fn check_keys(keys: &[String]) -> Result<(), Error> {
    if keys.is_empty() {
        return Err(Error::BadRequest(
            "keys: needs at least one key to reserve on".into(),
        ));
    }
    if keys.len() > MAX_RESERVATION_KEYS {
        return Err(Error::BadRequest(format!(
            "keys: {} keys; a reservation holds at most {MAX_RESERVATION_KEYS}",
            keys.len()
        )));
    }
    for (i, k) in keys.iter().enumerate() {
        check_key(k).map_err(|e| e.at(&format!("keys[{i}]")))?;
        if keys[..i].contains(k) {
            return Err(Error::BadRequest(format!(
                "keys[{i}]: {k:?} is listed twice (a reservation counts each key once)"
            )));
        }
    }
    Ok(())
}

/// Not open: committed already, lapsed, never made, or made in another namespace.
pub(crate) fn not_open(id: &str, namespace: &str) -> Error {
    Error::UnknownReservation(format!(
        "reservation: {id:?} is not open in namespace {namespace:?} (committed already, lapsed at its total, never made, or made in another namespace); nothing was changed"
    ))
}

/// A reservation of several keys named by one of them (or the reverse).
fn not_of_key(id: &str, key: &str) -> Error {
    Error::UnknownReservation(format!(
        "reservation: {id:?} is not a reservation of key {key:?} alone (a reservation of several keys is extended and committed at /v1/namespaces/{{namespace}}/extend and /commit); nothing was changed"
    ))
}

fn lapse(now: UnixMs, ttl: Duration) -> UnixMs {
    UnixMs(now.0.saturating_add(ttl.as_millis() as i64))
}

/// A hit of `cost` on each of `keys`, as the asks of a reserve or an extend (the keys
/// checked before: what is left to fail is the namespace or the cost).
fn hits<'r>(
    ns: &'r crate::state::Namespace,
    keys: &'r [String],
    cost: f64,
) -> Result<Vec<crate::pipeline::Asked<'r>>, Error> {
    keys.iter()
        .map(|key| {
            let t = crate::pipeline::Take::of_key(ns, ns.sync.name(), key, cost)?;
            Ok(crate::pipeline::Asked::Hit(t))
        })
        .collect()
}

/// Each key's verdict, from what the asks [`hits`] made took.
fn verdicts(
    keys: &[String],
    taken: Vec<Option<crate::pipeline::Taken>>,
) -> Result<Vec<(String, Verdict)>, Error> {
    keys.iter()
        .zip(taken)
        .map(|(key, taken)| match taken {
            Some(crate::pipeline::Taken::Hit(v)) => Ok((key.clone(), v)),
            _ => Err(Error::Internal),
        })
        .collect()
}

/// The strictest of `verdicts` (a denied one first), or an internal error for none.
fn strictest(verdicts: &[(String, Verdict)]) -> Result<Verdict, Error> {
    swin_core::Decision::strictest(verdicts, |(_, v)| &v.decision)
        .map(|(_, v)| v.clone())
        .ok_or(Error::Internal)
}

/// Reads the reservation `id` of the namespace, open or ended (a commit of an ended one
/// answers how it was settled): its keys and total, checked against `key` when the
/// caller named one (a reservation of that key alone).
pub(crate) async fn open_record(
    ns: &crate::state::Namespace,
    id: &str,
    key: Option<&str>,
) -> Result<swin_sync::store::ReservationRecord, Error> {
    check_id(id)?;
    if let Some(k) = key {
        check_key(k)?;
    }
    let name = ns.sync.name();
    let record = ns
        .reservations
        .read(id, swin_sync::now())
        .await?
        .ok_or_else(|| not_open(id, name))?;
    if let Some(k) = key {
        if record.keys.len() != 1 || record.keys[0] != k {
            return Err(not_of_key(id, k));
        }
    }
    Ok(record)
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}
