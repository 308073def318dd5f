//! An extend: `more` added to an open reservation, decided as a hit of `more` on each
//! of its keys (all or nothing); allowed, the reservation's total grows.

use std::sync::Arc;

use swin_core::UnixMs;

use super::{hits, not_open, strictest, verdicts, Reserved};
use crate::error::Error;
use crate::pipeline::{Plan, Ran, Request};
use crate::state::Namespace;

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
        let ns = &self.ns;
        // bounded as a lease's renewal is: past the request's answer time the store
        // changes nothing (an error takes back what the hits took)
        let raised = ns
            .reservations
            .extend(&self.id, self.more, plan.taken_at, swin_sync::now())
            .await?;
        let record = raised.ok_or_else(|| not_open(&self.id, ns.sync.name()))?;
        Ok((record.total, record.expires_at))
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<Self::Acted>) -> Result<Reserved, Error> {
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
