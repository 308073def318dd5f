//! Leases over HTTP and in the library: an acquire of slots ([`Acquire`], taken by the
//! pipeline as Envoy's are), and a release or renewal of a live lease
//! ([`EndOrRenew`]).

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;

use crate::error::Error;
use crate::leases::{check_lease_id, lease_ttl, AcquireAnswer, AcquireRequest, LeaseBook};
use crate::pipeline::{concurrency_of, Acquiring, Asked, Plan, Ran, Request, Taken};
use crate::policy::input::check_key;
use crate::state::Namespace;

/// Takes `req.count` slots of `key` if the key's live leases leave room. An acquire in
/// a store is carried out to its answer even when its caller goes away (and ended by
/// the node if that answer was an error), never cut off half-way.
#[derive(Debug)]
pub(crate) struct Acquire {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) req: AcquireRequest,
}

impl Request for Acquire {
    type Answer = AcquireAnswer;
    type Acted = ();

    fn waits_on_store(&self) -> bool {
        matches!(self.ns.leases, LeaseBook::Store(_))
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let ns = &*self.ns;
        let a = Acquiring::of_request(ns, ns.sync.name(), &self.key, self.req.clone())?;
        Ok(Plan::of(vec![Asked::Slots(a)]))
    }

    async fn act(&self, _: &Plan<'_>) -> Result<(), Error> {
        Ok(())
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<()>) -> Result<AcquireAnswer, Error> {
        match ran.taken.into_iter().next() {
            Some(Some(Taken::Slots(a))) => Ok(a),
            _ => Err(Error::Internal),
        }
    }
}

/// Ends a live lease of `key` (`ttl` none: its slots are free at once) or moves its
/// lapse to `ttl` seconds from now; answers the new lapse time (a release: now). 404
/// `unknown_lease` when it is unknown, released or lapsed (nothing changes).
#[derive(Debug)]
pub(crate) struct EndOrRenew {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) lease: String,
    /// `None`: a release; `Some(ttl)`: a renewal (`ttl` none: the namespace's).
    pub(crate) renew: Option<Option<f64>>,
}

impl Request for EndOrRenew {
    type Answer = UnixMs;
    type Acted = UnixMs;

    fn waits_on_store(&self) -> bool {
        matches!(self.ns.leases, LeaseBook::Store(_))
    }

    fn plan(&self) -> Result<Plan<'_>, Error> {
        let c = concurrency_of(&self.ns, self.ns.sync.name())?;
        if let Some(ttl) = self.renew {
            lease_ttl(ttl, &c)?;
        }
        check_key(&self.key)?;
        check_lease_id(&self.lease)?;
        Ok(Plan::nothing())
    }

    async fn act(&self, _: &Plan<'_>) -> Result<UnixMs, Error> {
        let ttl: Option<Duration> = match self.renew {
            Some(ttl) => Some(lease_ttl(
                ttl,
                &concurrency_of(&self.ns, self.ns.sync.name())?,
            )?),
            None => None,
        };
        let r = self.end_or_renew(ttl).await;
        let (recorder, name) = (self.ns.recorder(), self.ns.sync.name());
        match &r {
            Ok(_) if ttl.is_some() => recorder.lease(name, "renewed"),
            Ok(_) => recorder.lease(name, "released"),
            Err(Error::UnknownLease(_)) => recorder.lease(name, "not_live"),
            Err(_) => {}
        }
        r
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<UnixMs>) -> Result<UnixMs, Error> {
        ran.acted.ok_or(Error::Internal)
    }
}

impl EndOrRenew {
    async fn end_or_renew(&self, ttl: Option<Duration>) -> Result<UnixMs, Error> {
        let (key, lease) = (&self.key, &self.lease);
        let now = swin_sync::now();
        let to = ttl.map(|t| UnixMs(now.0.saturating_add(t.as_millis() as i64)));
        let what = match to {
            Some(_) => "renewing a lease",
            None => "releasing a lease",
        };
        let done = self
            .ns
            .leases
            .end_or_renew(key, lease, now, to, what)
            .await?;
        if !done {
            return Err(Error::UnknownLease(format!(
                "lease {lease:?} of key {key:?} is not live (released, lapsed or never granted); nothing was changed"
            )));
        }
        Ok(to.unwrap_or(now))
    }
}
