//! An extend: `more` added to an open reservation, decided as a hit of `more` on each
//! of its keys (all or nothing); allowed, the reservation's total grows.

use std::sync::Arc;

use swin_core::UnixMs;

use swin_sync::store::new_op;

use super::{hits, not_open, strictest, verdicts, Reserved};
use crate::error::Error;
use crate::known::{resolve, until_known, Outcome};
use crate::pipeline::{Plan, Ran, Request};
use crate::state::Namespace;
use crate::unresolved::{Owed, OwedExtend, Owing};

/// Spends `more` on each of the reservation's `keys` as a hit would and, when every one
/// is allowed, raises its total (an extend of a reservation that ended meanwhile takes
/// its hits back: 404 `unknown_reservation`). Denied, the reservation keeps what it had
/// (`total`, as its record was read).
#[derive(Debug)]
pub(crate) struct Extend {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) keys: Vec<String>,
    pub(crate) id: String,
    pub(crate) more: f64,
    /// Its total and lapse as read before the extend.
    pub(crate) total: f64,
    pub(crate) expires_at: UnixMs,
}

impl Request for Extend {
    type Answer = Reserved;
    /// The total after it, and its lapse.
    type Acted = (f64, UnixMs);

    fn waits_on_store(&self) -> bool {
        true
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let ns = &*self.ns;
        let asks = hits(ns, &self.keys, self.more)?;
        let mut plan = Plan::of(asks);
        if self.keys.len() > 1 {
            plan.label = Some("keys");
        }
        Ok(plan)
    }

    async fn act(&self, plan: &Plan<'_>) -> Result<Self::Acted, Error> {
        let (ns, id, more, at) = (&self.ns, self.id.as_str(), self.more, plan.taken_at);
        // bounded as a lease's renewal is: past the request's answer time the store
        // changes nothing (an error takes back what the hits took); sent again, under
        // its operation id, while its reply is lost
        let op = new_op();
        let left = plan.left_of(ns.sync.answer_within());
        let raised = until_known(left, |w| ns.reservations.extend(id, &op, more, at, w)).await;
        let record = match raised {
            Outcome::Known(r) => r.ok_or_else(|| not_open(id, ns.sync.name()))?,
            Outcome::NotApplied(e) => return Err(Error::store(&e, "extending a reservation")),
            Outcome::Unknown(e) => {
                tracing::warn!(cause = %e, id, "an extend's outcome is unknown; resolved in the background");
                let owed = OwedExtend {
                    namespace: ns.sync.name().to_owned(),
                    reservation: self.id.clone(),
                    keys: self.keys.clone(),
                    op,
                    more,
                    at: at.0,
                };
                let owing = ns.unresolved.hold(Owed::Extend(owed.clone()));
                tokio::spawn(resume_extend(ns.clone(), owed, owing));
                return Err(Error::outcome_unknown(
                    &format!("extending reservation {id:?}"),
                    "the extend is then in the reservation's total (with its hits), or its hits are given back; retry with the same Idempotency-Key, or commit the cost used (a commit settles against whatever total the reservation has)",
                ));
            }
        };
        Ok((record.total, record.expires_at))
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Self::Acted>) -> Result<Reserved, Error> {
        // (an extend whose outcome is unknown returned its error before this)
        let recorder = self.ns.recorder();
        let name = self.ns.sync.name();
        let verdicts = verdicts(&self.keys, ran.taken)?;
        let (reservation, total) = match ran.acted {
            Some((total, at)) => {
                recorder.reservation(name, "extended");
                recorder.reservation_cost(name, "extended", self.more * self.keys.len() as f64);
                (Some((self.id.clone(), at)), total)
            }
            None => {
                recorder.reservation(name, "extend_denied");
                (Some((self.id.clone(), self.expires_at)), self.total)
            }
        };
        Ok(Reserved {
            verdict: strictest(&verdicts)?,
            verdicts,
            reservation,
            total,
            cost: self.more,
        })
    }
}

/// An extend whose answer was lost (`owed`, held by `owing` until resolved): asked again
/// under its operation id until the store answers. Applied (now or before), its hits
/// stay, counted in the reservation's total; not open (committed or lapsed without it),
/// its hits go back, in the windows they were taken in — unless a stop took what is
/// owed first (the next start asks again and gives them back).
pub(crate) async fn resume_extend(ns: Arc<Namespace>, owed: OwedExtend, owing: Owing) {
    let OwedExtend {
        reservation: id,
        keys,
        op,
        more,
        at,
        ..
    } = owed;
    let at = UnixMs(at);
    let each = ns.sync.store_timeout();
    let asked = resolve(each, |w| ns.reservations.extend(&id, &op, more, at, w)).await;
    match asked {
        Some(Some(_)) => {}
        Some(None) => {
            let giving = Owed::Other(format!(
                "the give-back of an extend of reservation {id:?} by {more} that was not applied"
            ));
            if !owing.go_on(giving) {
                return;
            }
            for key in &keys {
                if let Err(e) = undo_hit(&ns, key, more, at).await {
                    tracing::warn!(cause = %e, key, more, "an extend not applied: its hit stays spent");
                }
            }
        }
        None => tracing::error!(
            id,
            more,
            "an extend's outcome stays unknown: the store did not answer"
        ),
    }
    drop(owing);
}

/// Takes back a hit of `cost` on `key` taken at `at`, retried until the store answers.
pub(super) async fn undo_hit(
    ns: &Namespace,
    key: &str,
    cost: f64,
    at: UnixMs,
) -> Result<(), Error> {
    let Some(l) = &ns.limits else {
        return Ok(());
    };
    let each = ns.sync.store_timeout();
    let undone = resolve(each, |_| async {
        let limits = ns.effective(key, l.for_key(key));
        crate::pipeline::Take::under(ns, key, cost, limits, false)
            .undo(at)
            .await
            .map_err(|e| swin_sync::StoreError::Unavailable(e.to_string()))
    })
    .await;
    undone.ok_or_else(|| Error::Unavailable("the store did not answer".into()))
}
