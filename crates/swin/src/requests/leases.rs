//! Leases over HTTP and in the library: an acquire of slots ([`Acquire`], taken by the
//! pipeline as Envoy's are), and a release or renewal of a live lease
//! ([`EndOrRenew`]).

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;

use crate::error::Error;
use swin_sync::store::Released;

use crate::leases::{advised, check_lease_id, lease_ttl, AcquireAnswer, AcquireRequest};
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
        self.ns.leases.is_shared()
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
/// lapse to `ttl` seconds from now; answers the new lapse time (a release: now), and
/// whether another release ended the lease before (a release sent again after its
/// answer was lost: `replayed`, nothing changed). 404 `unknown_lease` when it is not
/// live (never granted, lapsed, released more than two minutes ago): nothing changes. A
/// store reply lost is sent again within `answer_timeout` (a release under its
/// operation id, a renewal to the same lapse); still unknown, 503 `outcome_unknown`.
#[derive(Debug)]
pub(crate) struct EndOrRenew {
    pub(crate) ns: Arc<Namespace>,
    pub(crate) key: String,
    pub(crate) lease: String,
    /// `None`: a release; `Some(ttl)`: a renewal (`ttl` none: the namespace's).
    pub(crate) renew: Option<Option<f64>>,
}

impl Request for EndOrRenew {
    /// The new lapse (a release: now), and whether it was `replayed`.
    type Answer = (UnixMs, bool);
    type Acted = (UnixMs, bool);

    fn waits_on_store(&self) -> bool {
        self.ns.leases.is_shared()
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

    async fn act(&self, plan: &Plan<'_>) -> Result<(UnixMs, bool), Error> {
        let ttl: Option<Duration> = match self.renew {
            Some(ttl) => Some(lease_ttl(
                ttl,
                &concurrency_of(&self.ns, self.ns.sync.name())?,
            )?),
            None => None,
        };
        let within = plan.left_of(self.ns.leases.answer_within());
        let r = match ttl {
            Some(ttl) => self.renew(ttl, within).await.map(|to| (to, false)),
            None => self.release(within).await,
        };
        let (recorder, name) = (self.ns.recorder(), self.ns.sync.name());
        match &r {
            Ok(_) if ttl.is_some() => recorder.lease(name, "renewed"),
            Ok((_, true)) => recorder.lease(name, "replayed"),
            Ok(_) => recorder.lease(name, "released"),
            Err(Error::UnknownLease(_)) => recorder.lease(name, "not_live"),
            Err(_) => {}
        }
        r
    }

    fn answer(&self, _: Plan<'_>, ran: Ran<(UnixMs, bool)>) -> Result<(UnixMs, bool), Error> {
        ran.acted.ok_or(Error::Internal)
    }
}

impl EndOrRenew {
    fn not_live(&self) -> Error {
        let (key, lease) = (&self.key, &self.lease);
        Error::UnknownLease(format!(
            "lease {lease:?} of key {key:?} is not live (lapsed, never granted, or released more than two minutes ago); nothing was changed"
        ))
    }

    /// Ends the lease: now, and whether another release ended it before.
    async fn release(&self, within: Duration) -> Result<(UnixMs, bool), Error> {
        let now = swin_sync::now();
        let released = self
            .ns
            .leases
            .release(&self.key, &self.lease, now, within, "releasing a lease")
            .await
            .map_err(|e| {
                advised(e, "release it again: the retry answers 200 (`replayed` when this release ended it)")
            })?;
        match released {
            Released::Now => Ok((now, false)),
            Released::Before => Ok((now, true)),
            Released::NotLive => Err(self.not_live()),
        }
    }

    /// Moves the lease's lapse to `ttl` from now: the new lapse.
    async fn renew(&self, ttl: Duration, within: Duration) -> Result<UnixMs, Error> {
        let now = swin_sync::now();
        let to = UnixMs(now.0.saturating_add(ttl.as_millis() as i64));
        let renewed = self
            .ns
            .leases
            .renew(&self.key, &self.lease, to, now, within, "renewing a lease")
            .await
            .map_err(|e| {
                advised(e, "renew it again: a lease still live is renewed from the retry's time (its lapse is then the retry's answer)")
            })?;
        match renewed {
            true => Ok(to),
            false => Err(self.not_live()),
        }
    }
}
