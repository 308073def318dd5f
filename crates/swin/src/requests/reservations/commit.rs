//! A commit: the reservation ended (exactly once, on any node), then each of its keys
//! settled at the actual cost against the reservation's total.

use std::sync::Arc;

use swin_core::check_cost;

use swin_sync::store::{new_op, ReservationRecord};

use super::ending::Ending;
use super::settlement::next_hit;
use super::{not_open, Settled};
use crate::decisions::{limits_of, HitAnswer};
use crate::error::Error;
use crate::known::{until_known, Outcome};
use crate::pipeline::{Plan, Ran, Request, Take};
use crate::policy::limits::KeyLimits;
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
            // counted where it ended the reservation (`Ending::settle`)
            Ok(_) => {}
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
            Outcome::Known(Some(r)) => {
                // a place freed: refusals this node remembers no longer hold
                ns.cap_checks.freed();
                r
            }
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
                    ending.resolve(op, &owing).await;
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
                owed: 0.0,
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
