//! A reserve: the estimate spent on each key as a hit would be (all or nothing), and
//! when allowed the reservation recorded.

use std::sync::Arc;

use swin_core::UnixMs;
use swin_sync::store::{new_op, OpenReservation, Opening};

use super::{
    hits, lapse, new_id, reservation_ttl, strictest, verdicts, Reserved, RETRY_EVERY, RETRY_FOR,
};
use crate::error::Error;
use crate::idempotency::ClientId;
use crate::known::{until_known, Outcome};
use crate::pipeline::{Plan, Ran, Request, Take};
use crate::state::Namespace;
use crate::unresolved::{Owed, OwedUndo, Owing};

/// Spends `cost` on each of `keys` as a hit would and, when every one is allowed,
/// records the reservation (the decisions, the reserve and its cost recorded as well).
/// Spent, then recorded: it runs to its end once started, so that a client going away
/// cannot leave the estimate spent and no reservation.
#[derive(Debug)]
pub(crate) struct Reserve {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) keys: Vec<String>,
    pub(crate) cost: f64,
    pub(crate) ttl: Option<f64>,
    /// Errors name each key as `keys[i]` (a reservation of several keys).
    pub(crate) several: bool,
    /// Who asks it, counted against `reservations_max_open_per_client` (`None`: against
    /// the namespace's cap only).
    pub(crate) client: Option<ClientId>,
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
        if self.several {
            super::check_keys(&self.keys)?;
        }
        // a cap that refused this client a moment ago refuses it before it spends
        let client = self.client.as_ref().map_or("", ClientId::as_str);
        if let Some(refused) = ns.cap_checks.refused(client) {
            return Err(cap_refusal(ns, refused, "nothing was spent"));
        }
        let asks = hits(ns, &self.keys, self.cost)?;
        let mut plan = Plan::of(asks);
        if self.several {
            plan.label = Some("keys");
        }
        Ok(plan)
    }

    async fn act(&self, plan: &Plan<'_>) -> Result<Self::Acted, Error> {
        let (ns, cost) = (&self.ns, self.cost);
        let id = new_id();
        let now = swin_sync::now();
        let expires_at = lapse(now, reservation_ttl(self.ttl)?);
        let client = self.client.as_ref().map_or("", ClientId::as_str);
        let checking = ns
            .cap_checks
            .begin(client, ns.reservation_caps, counts_cheaply(ns));
        let open = OpenReservation {
            id: &id,
            keys: &self.keys,
            total: cost,
            expires_at,
            now,
            at: plan.taken_at,
            client,
            max_open: checking.max_open,
            max_open_per_client: checking.max_open_per_client,
        };
        // within what the take left of the answer time, sent again while its reply is
        // lost (the id is the opening's own: an opening sent again finds its record)
        let left = plan.left_of(ns.sync.answer_within());
        let recorded = until_known(left, |within| ns.reservations.open(open, within)).await;
        if let Outcome::Known(opened) = &recorded {
            checking.saw(opened);
        }
        drop(checking);
        let recorded = match recorded {
            Outcome::Known(opened) => Outcome::Known(opened.opening),
            Outcome::NotApplied(e) => Outcome::NotApplied(e),
            Outcome::Unknown(e) => Outcome::Unknown(e),
        };
        let failed = match recorded {
            Outcome::Known(Opening::Open) => return Ok(Ok((id, expires_at))),
            Outcome::Known(refused @ (Opening::Full | Opening::ClientFull)) => {
                cap_refusal(ns, refused, "what this reserve spent is given back")
            }
            Outcome::Known(Opening::Taken) => {
                // 128 random bits: another live record with this id is a bug
                tracing::error!(id, "a new reservation id was already recorded");
                Error::Internal
            }
            // the node's own table is full (a local-only namespace): a 503, try later
            Outcome::NotApplied(swin_sync::StoreError::Full(m)) => Error::Unavailable(m),
            Outcome::NotApplied(e) | Outcome::Unknown(e) => {
                tracing::warn!(cause = %e, "recording a reservation");
                Error::Store {
                    reason: e.reason(),
                    message: "recording a reservation: the store did not confirm it in time; the reservation is not made (this node ends its record if the store wrote it) and what it spent is given back".into(),
                }
            }
        };
        // nobody knows the id: the node takes the estimate back, and ends the record in
        // case the store wrote it
        let owed = OwedUndo {
            namespace: ns.sync.name().to_owned(),
            reservation: id,
            keys: self.keys.clone(),
            cost,
            at: plan.taken_at.0,
            lapse: expires_at.0,
            op: new_op(),
            given_back: false,
        };
        let owing = ns.unresolved.hold(Owed::Undo(owed.clone()));
        tokio::spawn(undo(ns.clone(), owed, owing));
        Ok(Err(failed))
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Self::Acted>) -> Result<Reserved, Error> {
        let recorder = self.ns.recorder();
        let name = self.ns.sync.name();
        let verdicts = verdicts(&self.keys, ran.taken)?;
        let reservation = match ran.acted {
            Some(acted) => Some(acted?),
            None => None,
        };
        match reservation {
            Some(_) => {
                recorder.reservation(name, "reserved");
                recorder.reservation_cost(name, "reserved", self.cost * self.keys.len() as f64);
            }
            None => recorder.reservation(name, "denied"),
        }
        Ok(Reserved {
            verdict: strictest(&verdicts)?,
            verdicts,
            total: if reservation.is_some() {
                self.cost
            } else {
                0.0
            },
            reservation,
            cost: self.cost,
        })
    }
}

/// Whether the namespace's reservations are counted cheaply (Redis: the size of a set;
/// this node's memory), so that every opening checks the caps.
fn counts_cheaply(ns: &Namespace) -> bool {
    use swin_sync::store::StoreKind;
    ns.sync
        .store()
        .is_none_or(|s| matches!(s.kind(), StoreKind::Redis | StoreKind::RedisCluster))
}

/// The error of a reserve a cap refused (`refused`: `Full` or `ClientFull`); `spent`
/// says what became of its estimate.
fn cap_refusal(ns: &Namespace, refused: Opening, spent: &str) -> Error {
    let name = ns.sync.name();
    match refused {
        Opening::ClientFull => Error::Exhausted(format!(
            "this client holds {} open reservations in namespace {name:?} (reservations_max_open_per_client); its new ones are refused until some are committed or lapse; {spent}",
            ns.reservation_caps.max_open_per_client(),
        )),
        _ => Error::Unavailable(format!(
            "namespace {name:?} holds {} open reservations (reservations_max_open); a new one is refused until some are committed or lapse; {spent}",
            ns.reservation_caps.max_open()
        )),
    }
}

/// Undoes a reserve that answered an error (`owed`, held by `owing` until done): the
/// estimate goes back on every key (in the windows it was taken in), and the record (if
/// the store wrote it) ends; each retried until the store answers. A stop before the
/// give-back began, or after it, spools what is left; the next start does it.
pub(crate) async fn undo(ns: Arc<Namespace>, mut owed: OwedUndo, owing: Owing) {
    if !owed.given_back {
        let giving = Owed::Other(format!(
            "the give-back of a reserve's estimate of {} (reservation {:?}), under way",
            owed.cost, owed.reservation
        ));
        if !owing.go_on(giving) {
            return;
        }
        give_back_estimate(&ns, &owed).await;
        owed.given_back = true;
        if !owing.go_on(Owed::Undo(owed.clone())) {
            return;
        }
    }
    // the record, until it would have lapsed anyway: ended (at cost 0, by an operation
    // of its own), so that no opening of it sent late can make it open again
    let each = ns.sync.store_timeout();
    while swin_sync::now() < UnixMs(owed.lapse) {
        match ns
            .reservations
            .take(&owed.reservation, &owed.op, 0.0, each)
            .await
        {
            Ok(_) => break,
            Err(_) => tokio::time::sleep(RETRY_EVERY).await,
        }
    }
    drop(owing);
}

/// A failed reserve's estimate back on each of its keys, each retried for a while.
async fn give_back_estimate(ns: &Namespace, owed: &OwedUndo) {
    let (cost, at) = (owed.cost, UnixMs(owed.at));
    for key in &owed.keys {
        let deadline = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            let undone = match &ns.limits {
                Some(l) => {
                    let limits = ns.effective(key, l.for_key(key));
                    Take::under(ns, key.as_str(), cost, limits, false)
                        .undo(at)
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
    }
}
