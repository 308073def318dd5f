//! Reserve, then commit: a cost known only after the answer (an LLM's tokens, bytes
//! sent, CPU seconds) spent as an estimate first and settled at the actual cost later,
//! on window and GCRA namespaces.
//!
//! - A reserve is the namespace's hit of `cost = estimate` (denied as a hit would be).
//!   When allowed, the reservation is recorded where the namespace keeps leases (its
//!   store, so that any node can settle it; a local-only namespace, this node) as a
//!   lease of one slot under no limit, until its ttl. Its id is `<128 random bits in
//!   hex>.<estimate>`: a commit reads the estimate back from the id, and an id whose
//!   estimate was changed is simply unknown.
//! - A commit ends the reservation (true exactly once, on every node: a commit repeated
//!   after a lost answer, or made after the ttl, is 404 `unknown_reservation` and settles
//!   nothing), then settles the difference through the namespace's admission: more than
//!   the estimate is charged up to what the limits leave (the rest is reported as
//!   `uncharged`: a commit never takes a key past its limit), less is given back as a
//!   refund is (never below zero, only in windows still counted).
//! - A reservation not committed by its ttl stays settled at its estimate.
//!
//! A commit runs to its end once started (a client that goes away does not cut it
//! between its two steps); a settlement the store refuses after the reservation ended is
//! retried by the node until the store answers.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use swin_core::{check_cost, UnixMs};
use swin_sync::store::Acquire;

use crate::config::MIN_TTL_SECS;
use crate::decisions::{limits_of, HitAnswer, Verdict};
use crate::error::Error;
use crate::pipeline::{Asked, Plan, Ran, Request, Take, Taken};
use crate::policy::input::check_key;
use crate::policy::limits::KeyLimits;
use crate::runtime_limits::Effective;
use crate::state::Namespace;

/// A reservation's life when the client names none.
pub const DEFAULT_RESERVATION_TTL_SECS: f64 = 30.0;
/// The longest life a reservation can ask for: a day.
pub const MAX_RESERVATION_TTL_SECS: f64 = 86_400.0;

/// Reservations are leases of one slot each under a limit no key reaches.
const NO_LIMIT: u64 = 1 << 53;
/// How long the node keeps trying a settlement or an undo the store refused.
const RETRY_FOR: Duration = Duration::from_secs(60);
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// A reserve's answer: the hit's verdict, and when allowed the reservation.
#[derive(Debug)]
pub struct Reserved {
    /// The hit's verdict.
    pub(crate) verdict: Verdict,
    /// The reservation's id and lapse time (allowed only).
    pub(crate) reservation: Option<(String, UnixMs)>,
}

impl Reserved {
    /// The hit's verdict.
    pub fn verdict(&self) -> &Verdict {
        &self.verdict
    }

    /// The reservation's id and lapse time (allowed only).
    pub fn reservation(&self) -> &Option<(String, UnixMs)> {
        &self.reservation
    }
}

/// How a commit settled.
#[derive(Debug, Serialize)]
pub struct Settled {
    /// True once settled (a second commit of it answers that it is unknown).
    pub(crate) committed: bool,
    /// Its id.
    pub(crate) reservation: String,
    /// What the reserve spent.
    pub(crate) estimate: f64,
    /// The actual cost it was settled at.
    pub(crate) cost: f64,
    /// Spent beyond the estimate.
    pub(crate) charged: f64,
    /// Of the estimate, given back.
    pub(crate) given_back: f64,
    /// Beyond the estimate but not charged: the limits had no room left for it.
    pub(crate) uncharged: f64,
    /// The key after the settlement, as a dry run sees it.
    #[serde(flatten)]
    pub(crate) after: HitAnswer,
    /// The key after the settlement, as its verdict.
    #[serde(skip)]
    pub(crate) verdict: Verdict,
}

impl Settled {
    /// True once settled (a second commit of it answers that it is unknown).
    pub fn committed(&self) -> bool {
        self.committed
    }

    /// Its id.
    pub fn reservation(&self) -> &String {
        &self.reservation
    }

    /// What the reserve spent.
    pub fn estimate(&self) -> f64 {
        self.estimate
    }

    /// The actual cost it was settled at.
    pub fn cost(&self) -> f64 {
        self.cost
    }

    /// Spent beyond the estimate.
    pub fn charged(&self) -> f64 {
        self.charged
    }

    /// Of the estimate, given back.
    pub fn given_back(&self) -> f64 {
        self.given_back
    }

    /// Beyond the estimate but not charged: the limits had no room left for it.
    pub fn uncharged(&self) -> f64 {
        self.uncharged
    }

    /// The key after the settlement, as a dry run sees it.
    pub fn after(&self) -> &HitAnswer {
        &self.after
    }

    /// The key after the settlement, as its verdict.
    pub fn verdict(&self) -> &Verdict {
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

/// A reservation id's estimate, or why the id is not one this node makes.
fn estimate_of(id: &str) -> Result<f64, Error> {
    let bad = || {
        Error::BadRequest(
            "reservation: not a reservation id (the id a reserve answered, \"<32 hex digits>.<estimate>\")".into(),
        )
    };
    let (random, estimate) = id.split_once('.').ok_or_else(bad)?;
    if random.len() != 32 || !random.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    if estimate.is_empty() || !estimate.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(bad());
    }
    let e: f64 = estimate.parse().map_err(|_| bad())?;
    check_cost(e).map_err(|_| bad())?;
    Ok(e)
}

fn lapse(now: UnixMs, ttl: Duration) -> UnixMs {
    UnixMs(now.0.saturating_add(ttl.as_millis() as i64))
}

/// Spends `cost` on `key` as a hit would and, when allowed, records the reservation
/// (the decision, the reserve and its cost recorded as well). Spent, then recorded: it
/// runs to its end once started, so that a client going away cannot leave the estimate
/// spent and no reservation.
#[derive(Debug)]
pub(crate) struct Reserve {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) cost: f64,
    pub(crate) ttl: Option<f64>,
}

impl Request for Reserve {
    type Answer = Reserved;
    /// The reservation's id and lapse, or why it could not be recorded (then this node
    /// takes the estimate back itself, retrying until the store answers).
    type Acted = Result<(String, UnixMs), Error>;

    fn waits_on_store(&self) -> bool {
        true
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let ns = &*self.ns;
        reservation_ttl(self.ttl)?;
        let t = Take::of_key(ns, ns.sync.name(), &self.key, self.cost)?;
        Ok(Plan::of(vec![Asked::Hit(t)]))
    }

    async fn act(&self, plan: &Plan<'_>) -> Result<Self::Acted, Error> {
        let (ns, key, cost) = (&self.ns, self.key.as_str(), self.cost);
        let id = format!("{:032x}.{cost}", rand::random::<u128>());
        let now = swin_sync::now();
        let expires_at = lapse(now, reservation_ttl(self.ttl)?);
        let a = Acquire {
            key,
            lease: &id,
            count: 1,
            limit: NO_LIMIT,
            expires_at,
            now,
        };
        // within what the take left of the answer time
        let left = plan.left_of(ns.sync.answer_within());
        let recorded = tokio::time::timeout(left, ns.leases.acquire(a, "recording a reservation"))
            .await
            .unwrap_or_else(|_| {
                Err(Error::Store {
                    reason: "store_unreachable",
                    message: "recording a reservation: the store did not answer in time; nothing was spent".into(),
                })
            });
        Ok(match recorded {
            Ok(a) if a.granted => Ok((id, expires_at)),
            failed => {
                // nobody knows the id: the node takes the estimate back and ends the
                // record in case the store wrote it before failing
                tokio::spawn(undo(ns.clone(), key.to_owned(), id, cost, expires_at));
                Err(failed.err().unwrap_or(Error::Internal))
            }
        })
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Self::Acted>) -> Result<Reserved, Error> {
        let recorder = self.ns.recorder();
        let name = self.ns.sync.name();
        let verdict = match ran.taken.into_iter().next() {
            Some(Some(Taken::Hit(v))) => v,
            _ => return Err(Error::Internal),
        };
        let reservation = match ran.acted {
            Some(acted) => Some(acted?),
            None => None,
        };
        match reservation {
            Some(_) => {
                recorder.reservation(name, "reserved");
                recorder.reservation_cost(name, "reserved", self.cost);
            }
            None => recorder.reservation(name, "denied"),
        }
        Ok(Reserved {
            verdict,
            reservation,
        })
    }
}

/// Undoes a reserve that answered an error: the estimate goes back, the record (if the
/// store wrote it) ends; each retried until the store answers.
async fn undo(ns: Arc<Namespace>, key: String, id: String, cost: f64, expires_at: UnixMs) {
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    loop {
        let undone = match &ns.limits {
            Some(l) => {
                let limits = ns.effective(&key, l.for_key(&key));
                Take::under(&ns, key.as_str(), cost, limits, false)
                    .undo()
                    .await
            }
            None => Ok(()),
        };
        if undone.is_ok() {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(key, cost, "a failed reserve's estimate stays spent");
            break;
        }
        tokio::time::sleep(RETRY_EVERY).await;
    }
    // the record, as an acquire cut short ends its lease
    crate::leases::undo_lease(ns.leases.clone(), key, id, expires_at).await;
}

/// Ends the reservation `id` of `key` and settles it at `cost`. It runs to its end once
/// started: a client that goes away does not cut it between its two steps.
#[derive(Debug)]
pub(crate) struct Commit {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) id: String,
    pub(crate) cost: f64,
}

impl Request for Commit {
    type Answer = Settled;
    type Acted = Settled;

    fn waits_on_store(&self) -> bool {
        true
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let (ns, key, cost) = (&*self.ns, self.key.as_str(), self.cost);
        check_key(key)?;
        limits_of(ns, ns.sync.name())?;
        estimate_of(&self.id)?;
        check_cost(cost).map_err(|_| {
            Error::BadRequest(format!(
                "cost: {cost} is not a number of at least 0 and below 2^53"
            ))
        })?;
        Ok(Plan::touching(vec![(ns, key)]))
    }

    async fn act(&self, _: &Plan<'_>) -> Result<Settled, Error> {
        let r = self.settle().await;
        let (recorder, name) = (self.ns.recorder(), self.ns.sync.name());
        match &r {
            Ok(s) => {
                recorder.reservation(name, "committed");
                recorder.reservation_cost(name, "charged", s.charged);
                recorder.reservation_cost(name, "given_back", s.given_back);
                recorder.reservation_cost(name, "uncharged", s.uncharged);
            }
            Err(Error::UnknownReservation(_)) => recorder.reservation(name, "not_open"),
            Err(_) => {}
        }
        r
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Settled>) -> Result<Settled, Error> {
        ran.acted.ok_or(Error::Internal)
    }
}

impl Commit {
    /// Ends the reservation, then settles the difference under the key's effective
    /// limits (read by the first touch).
    async fn settle(&self) -> Result<Settled, Error> {
        let (ns, key, id, cost) = (&self.ns, self.key.as_str(), self.id.as_str(), self.cost);
        let limits = limits_of(ns, ns.sync.name())?;
        let estimate = estimate_of(id)?;
        let effective: KeyLimits = (*ns.effective(key, limits.for_key(key))).clone();
        if matches!(&effective, KeyLimits::Gcra(_)) && cost.fract() != 0.0 {
            return Err(Error::BadRequest(format!(
                "cost: {cost} is not a whole number (the namespace's limit is a GCRA bucket)"
            )));
        }
        let now = swin_sync::now();
        let ended = ns
            .leases
            .end_or_renew(key, id, now, None, "committing a reservation")
            .await?;
        if !ended {
            return Err(Error::UnknownReservation(format!(
                "reservation {id:?} of key {key:?} is not open (committed already, lapsed at its estimate, or never made); nothing was settled"
            )));
        }
        // the reservation is ended: from here the node owns its settlement
        match settle(ns, key, &effective, estimate, cost).await {
            Ok((charged, given_back, after)) => Ok(Settled {
                committed: true,
                reservation: id.to_owned(),
                estimate,
                cost,
                charged,
                given_back,
                uncharged: (cost - estimate - charged).max(0.0),
                after: HitAnswer {
                    allowed: true,
                    ..after.answer()
                },
                verdict: after,
            }),
            Err(e) => {
                tokio::spawn(settle_later(
                    ns.clone(),
                    key.to_owned(),
                    effective,
                    estimate,
                    cost,
                ));
                Err(match e {
                Error::Store { reason, .. } => Error::Store {
                    reason,
                    message: format!(
                        "settling reservation {id:?}: the store could not be used; the reservation is ended and this node settles it when the store answers"
                    ),
                },
                other => other,
            })
            }
        }
    }
}

async fn settle_later(
    ns: Arc<Namespace>,
    key: String,
    limits: KeyLimits,
    estimate: f64,
    cost: f64,
) {
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(RETRY_EVERY).await;
        if settle(&ns, &key, &limits, estimate, cost).await.is_ok() {
            return;
        }
    }
    tracing::warn!(
        key,
        estimate,
        cost,
        "a reservation stays settled at its estimate"
    );
}

/// Pieces a commit's overrun is charged in, in a namespace in shadow.
const SHADOW_PIECES: usize = 16;

/// Charges or gives back the difference between `cost` and `estimate`: (charged, given
/// back, the key after it).
async fn settle(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    estimate: f64,
    cost: f64,
) -> Result<(f64, f64, Verdict), Error> {
    // each step a take of the request pipeline under the limits the commit read
    let under =
        |cost: f64, shadow: bool| Take::under(ns, key, cost, Effective::Config(limits), shadow);
    if cost < estimate {
        let (given, after) = under(estimate - cost, false).refund().await?;
        return Ok((0.0, given, after));
    }
    let mut left = cost - estimate;
    let mut charged = 0.0;
    let enforced = limits.enforced();
    let in_shadow = ns.limits.as_ref().is_some_and(|l| l.shadow);
    let Some(enforced) = enforced.filter(|_| !in_shadow) else {
        // a namespace in shadow (or limits all in shadow) refuses nothing: the whole
        // overrun counts, in pieces
        // every limit can take at once (at most SHADOW_PIECES; past that, uncharged)
        let most = limits.most_at_once();
        let mut last = None;
        for _ in 0..SHADOW_PIECES {
            if left <= 0.0 {
                break;
            }
            let piece = left.min(most);
            last = Some(under(piece, true).take(false).await?);
            charged += piece;
            left -= piece;
        }
        let after = match last {
            Some(v) => v,
            None => under(0.0, true).take(true).await?,
        };
        return Ok((charged, 0.0, after));
    };
    // what the enforced limits leave (a limit in shadow caps nothing: it counts the
    // charge and marks it), then that much at most; a hit racing in between can take
    // it first, so the room is read again (three tries, then the rest goes uncharged)
    for _ in 0..3 {
        let room_left = Take::under(ns, key, 0.0, Effective::Config(&enforced), false)
            .take(true)
            .await?;
        if left <= 0.0 {
            break;
        }
        let mut room = room_left.decision.remaining.min(left);
        if matches!(limits, KeyLimits::Gcra(_)) {
            room = room.floor();
        }
        if room <= 0.0 {
            break;
        }
        let v = under(room, false).take(false).await?;
        if v.allowed() {
            charged += room;
            left -= room;
            if left <= 0.0 {
                return Ok((charged, 0.0, v));
            }
        }
    }
    let now = under(0.0, false).take(true).await?;
    Ok((charged, 0.0, now))
}
