//! An extend: `more` added to an open reservation, decided as a hit of `more` on each
//! of its keys (all or nothing); allowed, the reservation's total grows.

use std::sync::Arc;

use swin_core::UnixMs;

use swin_sync::store::{extend_op, new_op, OP_LEN};

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
    /// What makes it this extend ([`extend_op`]): derived from the request's idempotency
    /// key (its retries are the same extend), else new.
    pub(crate) identity: String,
    /// The record holds this extend already (applied by an earlier request under the
    /// same idempotency key): answered from the record, spending nothing.
    pub(crate) replay: bool,
}

impl Request for Extend {
    type Answer = Reserved;
    /// The total after it, its lapse, and whether another request applied it (a retry
    /// under the same idempotency key: this one's hits went back).
    type Acted = (f64, UnixMs, bool);

    fn waits_on_store(&self) -> bool {
        true
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let ns = &*self.ns;
        let cost = if self.replay { 0.0 } else { self.more };
        let asks = hits(ns, &self.keys, cost)?;
        let mut plan = Plan::of(asks);
        plan.dry_run = self.replay;
        if self.keys.len() > 1 {
            plan.label = Some("keys");
        }
        Ok(plan)
    }

    async fn act(&self, plan: &Plan<'_>) -> Result<Self::Acted, Error> {
        let (ns, id, more, at) = (&self.ns, self.id.as_str(), self.more, plan.taken_at);
        if self.replay {
            return Ok((self.total, self.expires_at, true));
        }
        // bounded as a lease's renewal is: past the request's answer time the store
        // changes nothing (an error takes back what the hits took); sent again, under
        // its operation id, while its reply is lost
        let by = new_op();
        let op = extend_op(&self.identity, &by);
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
        let by_another = record.applied_by(&self.identity) != Some(by.as_str());
        if by_another {
            // the first request of this extend (its answer lost) applied it, resolved in
            // the background: this one's hits go back
            for key in &self.keys {
                if let Err(e) = undo_hit(ns, key, more, at).await {
                    tracing::warn!(cause = %e, key, more, "an extend applied by another request: this one's hit stays spent");
                }
            }
        }
        Ok((record.total, record.expires_at, by_another))
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Self::Acted>) -> Result<Reserved, Error> {
        // (an extend whose outcome is unknown returned its error before this)
        let recorder = self.ns.recorder();
        let name = self.ns.sync.name();
        let mut verdicts = verdicts(&self.keys, ran.taken)?;
        let (reservation, total) = match ran.acted {
            Some((total, at, true)) => {
                recorder.reservation(name, "replayed");
                for (_, v) in &mut verdicts {
                    v.decision.allowed = true;
                }
                (Some((self.id.clone(), at)), total)
            }
            None if self.replay => {
                // a dry run of 0 the key's debt refuses: the extend was applied all the same
                recorder.reservation(name, "replayed");
                for (_, v) in &mut verdicts {
                    v.decision.allowed = true;
                }
                (Some((self.id.clone(), self.expires_at)), self.total)
            }
            Some((total, at, false)) => {
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
    // who this extend is: its identity, and this request (the same for an extend no
    // other request can send again)
    let (identity, by) = op.split_at(OP_LEN.min(op.len()));
    let by = if by.is_empty() { identity } else { by };
    match asked {
        Some(Some(r)) if r.applied_by(identity) == Some(by) => {
            // counted as an extend answered is: once, by the request that applied it
            let (recorder, name) = (ns.recorder(), ns.sync.name());
            recorder.reservation(name, "extended");
            recorder.reservation_cost(name, "extended", more * keys.len() as f64);
        }
        // not open for it, or applied by a retry under the same idempotency key
        Some(_) => {
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
