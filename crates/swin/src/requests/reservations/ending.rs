//! A reservation this node ended (or may have) and settles: the settlement of each key
//! after a commit ended it, its resolution after a lost answer, the resumption of one an
//! earlier run spooled, and the retries of a settlement the store refused.

use std::sync::Arc;

use swin_core::UnixMs;
use swin_sync::store::ReservationRecord;

use super::settlement::{give_back_later, settle, Short};
use super::{Settled, RETRY_EVERY, RETRY_MOST};
use crate::decisions::{limits_of, HitAnswer};
use crate::error::Error;
use crate::known::resolve;
use crate::policy::limits::{KeyLimits, Overrun};
use crate::state::Namespace;
use crate::unresolved::{Owed, OwedCommit, OwedGiveBack, OwedSettle, Owing};

/// A reservation this node ended (or may have: its answer was lost) and settles: its
/// keys, each key's effective limits as the commit read them, the overrun rule and the
/// actual cost.
pub(super) struct Ending {
    pub(super) ns: Arc<Namespace>,
    pub(super) id: String,
    pub(super) keys: Vec<String>,
    pub(super) effective: Vec<KeyLimits>,
    pub(super) overrun: Overrun,
    pub(super) cost: f64,
}

impl Ending {
    /// A commit whose answer was lost (held owed by `owing`): asked again under its
    /// operation id until the store answers, then settled when it was this commit that
    /// ended the reservation — unless a stop took what is owed first (the commit is
    /// spooled, and the next start settles it).
    pub(super) async fn resolve(self, op: String, owing: &Owing) {
        let each = self.ns.sync.store_timeout();
        let book = &self.ns.reservations;
        let taken = resolve(each, |w| book.take(&self.id, &op, self.cost, w)).await;
        match taken {
            Some(Some(record)) if record.ended.as_ref().is_some_and(|e| e.op == op) => {
                let id = self.id.clone();
                let settling = Owed::Other(format!(
                    "the settlement of reservation {id:?} at cost {}",
                    self.cost
                ));
                if !owing.go_on(settling) {
                    return;
                }
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
    pub(super) async fn settle(self, record: &ReservationRecord) -> Result<Vec<Settled>, Error> {
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
                Ok((charged, given_back, after, short)) => all.push(Settled {
                    owed: owe(&ns, id, key, &limits, short),
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
                    let owed = OwedSettle {
                        namespace: ns.sync.name().to_owned(),
                        reservation: id.to_owned(),
                        key: key.clone(),
                        capped: overrun == Overrun::Cap,
                        estimate: total,
                        counted: counted.iter().map(|&(at, v)| (at.0, v)).collect(),
                        cost,
                    };
                    let owing = ns.unresolved.hold(Owed::Settle(owed.clone()));
                    tokio::spawn(settle_later(ns.clone(), owed, limits, owing));
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
        // ended by this commit: counted, whatever became of its keys' settlements
        count_commit(&ns, &all);
        match failed {
            None => Ok(all),
            // ended, its settlement owed: never a store code, which says nothing changed
            Some(Error::Store { .. }) => Err(Error::OutcomeUnknown(format!(
                "settling reservation {id:?}: the store could not be used; the reservation is ended at cost {cost} and this node settles it once when the store answers: send the same commit again to learn how it was settled"
            ))),
            Some(other) => Err(other),
        }
    }
}

/// Counts a commit that ended its reservation (`all`, the keys' settlements made) in the
/// namespace's metrics: answered, resolved after its answer was lost, or settling later.
fn count_commit(ns: &Namespace, all: &[Settled]) {
    let (recorder, name) = (ns.recorder(), ns.sync.name());
    recorder.reservation(name, "committed");
    let sum = |f: fn(&Settled) -> f64| all.iter().map(f).sum::<f64>();
    recorder.reservation_cost(name, "charged", sum(|s| s.charged));
    recorder.reservation_cost(name, "given_back", sum(|s| s.given_back));
    recorder.reservation_cost(name, "uncharged", sum(|s| s.uncharged));
}

/// Resolves a commit an earlier run of this node spooled with its outcome unknown (see
/// `crate::unresolved`): asked again under its operation id until the store answers,
/// then settled under the keys' effective limits now, when it was this commit that
/// ended the reservation (unless a stop took what is owed first: spooled again).
pub(crate) async fn resume(ns: Arc<Namespace>, owed: OwedCommit, owing: &Owing) {
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
    let settling = Owed::Other(format!(
        "the settlement of reservation {id:?} at cost {cost} (spooled by an earlier run)"
    ));
    if !owing.go_on(settling) {
        return;
    }
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

/// Gives back later what a key's give-back found short (see [`give_back_later`]),
/// held as owed until it is done: answers what is owed.
fn owe(ns: &Arc<Namespace>, id: &str, key: &str, limits: &KeyLimits, short: Short) -> f64 {
    let owed: f64 = short.iter().map(|&(_, left)| left).sum();
    if owed <= 0.0 {
        return 0.0;
    }
    let owed_back = OwedGiveBack {
        namespace: ns.sync.name().to_owned(),
        reservation: id.to_owned(),
        key: key.to_owned(),
        short: short.iter().map(|&(at, v)| (at.0, v)).collect(),
    };
    let owing = ns.unresolved.hold(Owed::GiveBack(owed_back.clone()));
    tokio::spawn(give_back_owed(ns.clone(), owed_back, limits.clone(), owing));
    owed
}

/// Gives back what `owed` says as its takes land (see [`give_back_later`]), held by
/// `owing` until done or taken by a stop.
async fn give_back_owed(ns: Arc<Namespace>, owed: OwedGiveBack, limits: KeyLimits, owing: Owing) {
    let short = owed.short.iter().map(|&(at, v)| (UnixMs(at), v)).collect();
    let left = give_back_later(&ns, &owed, &limits, short, &owing).await;
    if left > 0.0 {
        tracing::warn!(
            id = owed.reservation,
            key = owed.key,
            left,
            "a reservation's give-back stays short: its takes did not reach the store"
        );
    }
    drop(owing);
}

/// A give-back an earlier run spooled (see [`give_back_later`]), under the key's limits
/// now.
pub(crate) async fn resume_give_back(ns: Arc<Namespace>, owed: OwedGiveBack, owing: Owing) {
    let Some(limits) = key_limits(&ns, &owed.key) else {
        return;
    };
    give_back_owed(ns, owed, limits, owing).await;
}

/// A key's settlement an earlier run spooled (see [`settle_later`]), under the key's
/// limits now.
pub(crate) async fn resume_settle(ns: Arc<Namespace>, owed: OwedSettle, owing: Owing) {
    let Some(limits) = key_limits(&ns, &owed.key) else {
        return;
    };
    settle_later(ns, owed, limits, owing).await;
}

/// `key`'s effective limits now; `None` (logged) when the namespace has none.
fn key_limits(ns: &Namespace, key: &str) -> Option<KeyLimits> {
    match limits_of(ns, ns.sync.name()) {
        Ok(limits) => Some((*ns.effective(key, limits.for_key(key))).clone()),
        Err(_) => {
            tracing::error!(
                key,
                "a spooled settlement's namespace has no limits now: not settled"
            );
            None
        }
    }
}

/// A key's settlement the store refused (`owed`, held by `owing`): tried again, every
/// [`RETRY_EVERY`] and then less often, until the store takes it — or a stop takes
/// what is owed between two tries (spooled: the next start tries it).
async fn settle_later(ns: Arc<Namespace>, owed: OwedSettle, limits: KeyLimits, owing: Owing) {
    let overrun = match owed.capped {
        true => Overrun::Cap,
        false => Overrun::Debt,
    };
    let counted: Vec<(UnixMs, f64)> = owed
        .counted
        .iter()
        .map(|&(at, v)| (UnixMs(at), v))
        .collect();
    let (id, key) = (owed.reservation.as_str(), owed.key.as_str());
    let mut wait = RETRY_EVERY;
    loop {
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RETRY_MOST);
        let trying = Owed::Other(format!("{}, under way", Owed::Settle(owed.clone())));
        if !owing.go_on(trying) {
            return;
        }
        let reserved = (owed.estimate, counted.as_slice());
        match settle(&ns, key, &limits, overrun, reserved, owed.cost).await {
            Ok((.., short)) => {
                owe(&ns, id, key, &limits, short);
                return;
            }
            Err(e @ Error::Store { .. }) => {
                tracing::debug!(cause = %e, id, key, "a settlement waits for the store");
                if !owing.go_on(Owed::Settle(owed.clone())) {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(cause = %e, id, key, "a reservation stays settled at its estimate: its settlement is refused");
                return;
            }
        }
    }
}
