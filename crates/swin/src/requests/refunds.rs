//! A refund: hits admitted but not used, given back in every window the key's limits
//! count in, never below zero (GCRA: Boulder's refund, never past a full bucket). A hit
//! allowed and then not wanted (its request refused as a whole) is taken back by the
//! pipeline itself, exactly.

use std::sync::Arc;

use swin_core::check_cost;

use crate::decisions::{limits_of, HitAnswer, Verdict};
use crate::error::Error;
use crate::pipeline::{Back, Given, Plan, Ran, Request, Take};
use crate::policy::input::check_key;
use crate::runtime_limits::Effective;
use crate::state::Namespace;

/// What a refund gave back, and the key after it as a dry run would see it: a document
/// (see its `Serialize`).
#[derive(Debug, Clone)]
pub struct Refunded {
    pub(crate) given: f64,
    pub(crate) after: Verdict,
}

impl Refunded {
    /// The answer a door shows: `allowed` when anything was given back.
    fn answer(&self) -> HitAnswer {
        HitAnswer {
            allowed: self.given > 0.0,
            retry_after: 0.0,
            reason: None,
            refunded: Some(self.given),
            ..self.after.answer()
        }
    }
}

/// A refund serializes as the doors show it: the key's answer after it (as a dry run
/// sees it), `allowed` when anything was given back, `refunded` how much.
impl serde::Serialize for Refunded {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.answer().serialize(s)
    }
}

/// Gives back `cost` of hits admitted on `key` but not used.
#[derive(Debug)]
pub(crate) struct Refund {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) cost: f64,
}

impl Request for Refund {
    type Answer = Refunded;
    type Acted = ();

    fn waits_on_store(&self) -> bool {
        self.ns.counts_in_the_store()
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        check_key(&self.key)?;
        check_cost(self.cost)?;
        let limits = limits_of(&self.ns, self.ns.sync.name())?;
        let limits = Effective::Config(limits.for_key(&self.key));
        let t = Take::under(&self.ns, self.key.as_str(), self.cost, limits, false);
        Ok(Plan {
            refunds: vec![Back::Hits(t)],
            ..Plan::nothing()
        })
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<()>) -> Result<Refunded, Error> {
        match ran.refunded.into_iter().next() {
            Some(Given::Hits(given, after)) => Ok(Refunded { given, after }),
            _ => Err(Error::Internal),
        }
    }
}
