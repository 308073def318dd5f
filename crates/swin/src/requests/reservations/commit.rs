//! A commit: the reservation ended (exactly once, on any node), then each of its keys
//! settled at the actual cost against the reservation's total.

use std::sync::Arc;

use swin_core::{check_cost, UnixMs};

use swin_sync::store::{new_op, ReservationRecord};

use super::known::{resolve, until_known, Outcome};
use super::{not_open, Settled, RETRY_EVERY, RETRY_FOR};
use crate::decisions::{limits_of, HitAnswer, Verdict};
use crate::error::Error;
use crate::pipeline::{Plan, Ran, Request, Take};
use crate::policy::limits::{KeyLimits, Overrun};
use crate::runtime_limits::Effective;
use crate::state::Namespace;
use crate::unresolved::{Owed, OwedCommit};

/// Ends the reservation `id` (of `keys`, as its record read them) and settles each key
/// at `cost`. It runs to its end once started: a client that goes away does not cut it
/// between its steps.
#[derive(Debug)]
pub(crate) struct Commit {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) keys: Vec<String>,
    pub(crate) id: String,
    pub(crate) cost: f64,
}

impl Request for Commit {
    type Answer = Vec<Settled>;
    type Acted = Vec<Settled>;

    fn waits_on_store(&self) -> bool {
        true
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let (ns, cost) = (&*self.ns, self.cost);
        limits_of(ns, ns.sync.name())?;
        super::check_id(&self.id)?;
        check_cost(cost).map_err(|_| {
            Error::BadRequest(format!(
                "cost: {cost} is not a number of at least 0 and below 2^53"
            ))
        })?;
        Ok(Plan::touching(
            self.keys.iter().map(|k| (ns, k.as_str())).collect(),
        ))
    }

    async fn act(&self, plan: &Plan<'_>) -> Result<Vec<Settled>, Error> {
        let r = self.settle(plan).await;
        let (recorder, name) = (self.ns.recorder(), self.ns.sync.name());
        match &r {
            Ok(all) if all.iter().any(|s| s.replayed) => recorder.reservation(name, "replayed"),
            Ok(all) => {
                recorder.reservation(name, "committed");
                let sum = |f: fn(&Settled) -> f64| all.iter().map(f).sum::<f64>();
                recorder.reservation_cost(name, "charged", sum(|s| s.charged));
                recorder.reservation_cost(name, "given_back", sum(|s| s.given_back));
                recorder.reservation_cost(name, "uncharged", sum(|s| s.uncharged));
            }
            Err(Error::UnknownReservation(_)) => recorder.reservation(name, "not_open"),
            Err(_) => {}
        }
        r
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Vec<Settled>>) -> Result<Vec<Settled>, Error> {
        ran.acted.ok_or(Error::Internal)
    }
}

impl Commit {
    /// Each key's effective limits (read by the first touch), checked against the cost.
    fn effective(&self) -> Result<Vec<KeyLimits>, Error> {
        let (ns, cost) = (&self.ns, self.cost);
        let limits = limits_of(ns, ns.sync.name())?;
        let mut all = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let effective: KeyLimits = (*ns.effective(key, limits.for_key(key))).clone();
            if matches!(&effective, KeyLimits::Gcra(_)) && cost.fract() != 0.0 {
                return Err(Error::BadRequest(format!(
                    "cost: {cost} is not a whole number (the namespace's limit is a GCRA bucket)"
                )));
            }
            all.push(effective);
        }
        Ok(all)
    }

    /// Ends the reservation (as an operation of its own, sent again while its reply is
    /// lost), then settles each key under its effective limits. Ended by another commit
    /// before (a commit sent again after its answer was lost), it answers how that one
    /// settled it, settling nothing.
    async fn settle(&self, plan: &Plan<'_>) -> Result<Vec<Settled>, Error> {
        let (ns, id, cost) = (&self.ns, self.id.as_str(), self.cost);
        let ending = Ending {
            ns: ns.clone(),
            id: id.to_owned(),
            keys: self.keys.clone(),
            effective: self.effective()?,
            overrun: limits_of(ns, ns.sync.name())?.overrun,
            cost,
        };
        let op = new_op();
        let left = plan.left_of(ns.sync.answer_within());
        let record = match until_known(left, |w| ns.reservations.take(id, &op, cost, w)).await {
            Outcome::Known(Some(r)) => r,
            Outcome::Known(None) => return Err(not_open(id, ns.sync.name())),
            Outcome::NotApplied(e) => return Err(Error::store(&e, "committing a reservation")),
            Outcome::Unknown(e) => {
                tracing::warn!(cause = %e, id, "a commit's outcome is unknown; resolved in the background");
                let owing = ns.unresolved.hold(Owed::Commit(OwedCommit {
                    namespace: ns.sync.name().to_owned(),
                    reservation: id.to_owned(),
                    op: op.clone(),
                    cost,
                }));
                tokio::spawn(async move {
                    ending.resolve(op).await;
                    drop(owing);
                });
                return Err(Error::outcome_unknown(
                    &format!("committing reservation {id:?}"),
                    "retry the commit: it answers how the reservation was settled",
                ));
            }
        };
        if record.keys != self.keys {
            // ids are never reused: a record's keys never change
            tracing::error!(
                id,
                "a reservation's keys changed between its read and its commit"
            );
            return Err(Error::Internal);
        }
        match &record.ended {
            Some(e) if e.op == op => {}
            Some(e) => return self.replay(&record, e.cost, &ending.effective).await,
            None => return Err(Error::Internal),
        }
        // the reservation is ended: from here the node owns its settlement
        ending.settle(&record).await
    }

    /// The answer to a commit of a reservation another commit ended: at the same cost,
    /// what that one settled (`replayed`); at another, [`Error::AlreadyCommitted`].
    async fn replay(
        &self,
        record: &ReservationRecord,
        first: f64,
        effective: &[KeyLimits],
    ) -> Result<Vec<Settled>, Error> {
        let (ns, id, cost, total) = (&*self.ns, self.id.as_str(), self.cost, record.total);
        if first != cost {
            return Err(Error::AlreadyCommitted(format!(
                "reservation {id:?} was committed already, at cost {first}; this commit (cost {cost}) changed nothing"
            )));
        }
        let in_shadow = ns.limits.as_ref().is_some_and(|l| l.shadow);
        let mut all = Vec::with_capacity(self.keys.len());
        for (key, limits) in self.keys.iter().zip(effective) {
            let under = |c: f64| Take::under(ns, key, c, Effective::Config(limits), in_shadow);
            let after = next_hit(under(0.0).take(true).await?, under(1.0)).await?;
            all.push(Settled {
                committed: true,
                replayed: true,
                reservation: id.to_owned(),
                key: key.clone(),
                estimate: total,
                cost,
                charged: (cost - total).max(0.0),
                given_back: (total - cost).max(0.0),
                uncharged: 0.0,
                debt: after.decision.debt,
                after: HitAnswer {
                    allowed: true,
                    ..after.answer()
                },
                verdict: after,
            });
        }
        Ok(all)
    }
}

/// A reservation this node ended (or may have: its answer was lost) and settles: its
/// keys, each key's effective limits as the commit read them, the overrun rule and the
/// actual cost.
struct Ending {
    ns: Arc<Namespace>,
    id: String,
    keys: Vec<String>,
    effective: Vec<KeyLimits>,
    overrun: Overrun,
    cost: f64,
}

impl Ending {
    /// A commit whose answer was lost: asked again under its operation id until the
    /// store answers, then settled when it was this commit that ended the reservation.
    async fn resolve(self, op: String) {
        let each = self.ns.sync.store_timeout();
        let book = &self.ns.reservations;
        let taken = resolve(each, |w| book.take(&self.id, &op, self.cost, w)).await;
        match taken {
            Some(Some(record)) if record.ended.as_ref().is_some_and(|e| e.op == op) => {
                let id = self.id.clone();
                if let Err(e) = self.settle(&record).await {
                    tracing::warn!(cause = %e, id, "a commit resolved after a lost answer: its settlement failed");
                }
            }
            // another commit ended it, or it lapsed at its total: nothing of this one's
            Some(_) => {}
            None => tracing::error!(
                id = self.id,
                "a commit's outcome stays unknown: the store did not answer"
            ),
        }
    }

    /// Settles each key of the ended `record` at the actual cost.
    async fn settle(self, record: &ReservationRecord) -> Result<Vec<Settled>, Error> {
        let Ending {
            ns,
            id,
            keys,
            effective,
            overrun,
            cost,
        } = self;
        let id = id.as_str();
        let (total, counted) = (record.total, &record.counted);
        let mut all = Vec::with_capacity(keys.len());
        let mut failed = None;
        for (key, limits) in keys.iter().zip(effective) {
            match settle(&ns, key, &limits, overrun, (total, counted), cost).await {
                Ok((charged, given_back, after)) => all.push(Settled {
                    committed: true,
                    replayed: false,
                    reservation: id.to_owned(),
                    key: key.clone(),
                    estimate: total,
                    cost,
                    charged,
                    given_back,
                    uncharged: (cost - total - charged).max(0.0),
                    debt: after.decision.debt,
                    after: HitAnswer {
                        allowed: true,
                        ..after.answer()
                    },
                    verdict: after,
                }),
                // the store could not be used: this node settles it when it answers
                Err(e @ Error::Store { .. }) => {
                    tokio::spawn(settle_later(
                        ns.clone(),
                        key.clone(),
                        limits,
                        overrun,
                        (total, counted.clone()),
                        cost,
                    ));
                    failed.get_or_insert(e);
                }
                // refused (a count past 2^53): trying again would be refused again; the
                // reservation stays settled at its estimate on this key
                Err(e) => {
                    failed.get_or_insert(e.at(&format!(
                        "reservation {id:?} is ended at its estimate on key {key:?}, its settlement refused"
                    )));
                }
            }
        }
        match failed {
            None => Ok(all),
            Some(Error::Store { reason, .. }) => Err(Error::Store {
                reason,
                message: format!(
                    "settling reservation {id:?}: the store could not be used; the reservation is ended and this node settles it when the store answers"
                ),
            }),
            Some(other) => Err(other),
        }
    }
}

/// Resolves a commit an earlier run of this node spooled with its outcome unknown (see
/// `crate::unresolved`): asked again under its operation id until the store answers,
/// then settled under the keys' effective limits now, when it was this commit that
/// ended the reservation.
pub(crate) async fn resume(ns: Arc<Namespace>, owed: OwedCommit) {
    let OwedCommit {
        reservation: id,
        op,
        cost,
        ..
    } = owed;
    let each = ns.sync.store_timeout();
    let book = &ns.reservations;
    let taken = resolve(each, |w| book.take(&id, &op, cost, w)).await;
    let record = match taken {
        Some(Some(r)) if r.ended.as_ref().is_some_and(|e| e.op == op) => r,
        Some(_) => return,
        None => {
            tracing::error!(
                id,
                "a spooled commit's outcome stays unknown: the store did not answer"
            );
            return;
        }
    };
    let Ok(limits) = limits_of(&ns, ns.sync.name()) else {
        tracing::error!(
            id,
            "a spooled commit's namespace has no limits now: not settled"
        );
        return;
    };
    let overrun = limits.overrun;
    let effective = record
        .keys
        .iter()
        .map(|k| (*ns.effective(k, limits.for_key(k))).clone())
        .collect();
    let ending = Ending {
        ns: ns.clone(),
        id: id.clone(),
        keys: record.keys.clone(),
        effective,
        overrun,
        cost,
    };
    match ending.settle(&record).await {
        Ok(_) => tracing::info!(id, cost, "a spooled commit is settled"),
        Err(e) => tracing::warn!(cause = %e, id, "a spooled commit's settlement failed"),
    }
}

async fn settle_later(
    ns: Arc<Namespace>,
    key: String,
    limits: KeyLimits,
    overrun: Overrun,
    (estimate, counted): (f64, Vec<(UnixMs, f64)>),
    cost: f64,
) {
    let deadline = tokio::time::Instant::now() + RETRY_FOR;
    while tokio::time::Instant::now() < deadline {
        tokio::time::sleep(RETRY_EVERY).await;
        let reserved = (estimate, counted.as_slice());
        if settle(&ns, &key, &limits, overrun, reserved, cost)
            .await
            .is_ok()
        {
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

/// Charges or gives back the difference between `cost` and `estimate` (the
/// reservation's total, `counted` where its record says): (charged, given back, the key
/// after it).
async fn settle(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    overrun: Overrun,
    (estimate, counted): (f64, &[(UnixMs, f64)]),
    cost: f64,
) -> Result<(f64, f64, Verdict), Error> {
    // each step a take of the request pipeline under the limits the commit read
    let under =
        |cost: f64, shadow: bool| Take::under(ns, key, cost, Effective::Config(limits), shadow);
    if cost < estimate {
        let (given, after) =
            give_back(ns, key, limits, (estimate, counted), estimate - cost).await?;
        return Ok((0.0, given, after));
    }
    let in_shadow = ns.limits.as_ref().is_some_and(|l| l.shadow);
    if overrun == Overrun::Debt && cost > estimate {
        // all of it, even past the limit: counted whatever the decision
        let over = cost - estimate;
        let forced = Take {
            count_denied: true,
            ..under(over, in_shadow)
        };
        forced.take(false).await?;
        let after = under(0.0, in_shadow).take(true).await?;
        return Ok((over, 0.0, next_hit(after, under(1.0, in_shadow)).await?));
    }
    let (charged, given, after) = capped(ns, key, limits, in_shadow, cost - estimate).await?;
    Ok((
        charged,
        given,
        next_hit(after, under(1.0, in_shadow)).await?,
    ))
}

/// The key after a charge, saying when its next hit (of 1, `one`'s dry run) can pass
/// when none can now: not when a debt is paid (a bucket needs a unit more, a sliding
/// window the hit's weight more), nor 0 for a key left at its limit.
async fn next_hit(mut after: Verdict, one: Take<'_>) -> Result<Verdict, Error> {
    if !after.allowed() || after.decision.remaining < 1.0 {
        let next = one.take(true).await?;
        after.decision.retry_after = after.decision.retry_after.max(next.decision.retry_after);
    }
    Ok(after)
}

/// Gives back `back` of a reservation's total where it was counted, the latest takes
/// first: each take's part at its time, in the windows it counted in (one give-back per
/// run of takes that share their windows), never below zero on the cluster's count. What the record cannot place — takes it
/// did not keep, takes in windows older than the previous one, a GCRA bucket's — is
/// settled as a refund is, from the current window and then the previous one.
async fn give_back(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    (total, counted): (f64, &[(UnixMs, f64)]),
    back: f64,
) -> Result<(f64, Verdict), Error> {
    let under = |cost: f64| Take::under(ns, key, cost, Effective::Config(limits), false);
    let KeyLimits::Windows(set) = limits else {
        return under(back).settle().await;
    };
    let now = swin_sync::now();
    let windows_of =
        |at: UnixMs| -> Vec<i64> { set.iter().map(|l| l.window.start_of(at)).collect() };
    let live = |at: UnixMs| {
        set.iter()
            .all(|l| l.window.start_of(at) >= l.window.previous_start_of(now))
    };
    let placed: f64 = counted.iter().map(|&(_, v)| v).sum();
    // the takes the record did not keep came last
    let mut unplaced = (total - placed).max(0.0).min(back);
    let mut left = back - unplaced;
    let mut runs: Vec<(UnixMs, f64)> = Vec::new();
    for &(at, amount) in counted.iter().rev() {
        if left <= 0.0 {
            break;
        }
        let part = amount.min(left).max(0.0);
        left -= part;
        if !live(at) {
            unplaced += part;
            continue;
        }
        match runs.last_mut() {
            Some((last, sum)) if windows_of(*last) == windows_of(at) => *sum += part,
            _ => runs.push((at, part)),
        }
    }
    unplaced += left.max(0.0);
    let mut given = 0.0;
    let mut after = None;
    for (at, part) in runs {
        if part > 0.0 {
            let (back, then) = under(part).settle_at(at).await?;
            given += back;
            after = Some(then);
        }
    }
    if unplaced > 0.0 || after.is_none() {
        let (settled, then) = under(unplaced).settle().await?;
        given += settled;
        after = Some(then);
    }
    Ok((given, after.ok_or(Error::Internal)?))
}

/// `overrun = "cap"`: charges `left` up to what the limits leave: (charged, 0, the key
/// after it).
async fn capped(
    ns: &Namespace,
    key: &str,
    limits: &KeyLimits,
    in_shadow: bool,
    mut left: f64,
) -> Result<(f64, f64, Verdict), Error> {
    let under =
        |cost: f64, shadow: bool| Take::under(ns, key, cost, Effective::Config(limits), shadow);
    let mut charged = 0.0;
    let enforced = limits.enforced();
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
    // it first, so the room is read again (four tries, then the rest goes uncharged).
    // A strict bucket's room is the units this node holds and the store's room after
    // them, which one take cannot have at once: a denied take says what one could.
    let mut most = f64::INFINITY;
    for _ in 0..4 {
        let room_left = Take::under(ns, key, 0.0, Effective::Config(&enforced), false)
            .take(true)
            .await?;
        if left <= 0.0 {
            break;
        }
        let mut room = room_left.decision.remaining.min(left).min(most);
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
            most = f64::INFINITY;
            if left <= 0.0 {
                return Ok((charged, 0.0, v));
            }
        } else {
            most = v.decision.remaining;
        }
    }
    let now = under(0.0, false).take(true).await?;
    Ok((charged, 0.0, now))
}
