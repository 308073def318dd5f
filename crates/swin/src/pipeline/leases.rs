//! An acquire of slots as an ask of the pipeline (see [`super`]): checked when it is
//! made, taken through the namespace's lease book (shadow applied here and only here),
//! undone when its request is refused as a whole.

use std::borrow::Cow;
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::Acquire;

use crate::config::{Concurrency, MAX_CONCURRENCY};
use crate::error::Error;
use crate::leases::{
    advised, check_lease_id, lease_ttl, new_lease_id, undo_lease, AcquireAnswer, AcquireRequest,
    ENVOY_LEASES,
};
use crate::policy::input::check_key;
use crate::state::Namespace;

/// An acquire of `count` slots of a key under a lease, on its way through the pipeline.
#[derive(Debug, Clone)]
pub(crate) struct Acquiring<'r> {
    /// Its namespace (a concurrency namespace).
    pub(crate) ns: &'r Namespace,
    /// The key whose slots it takes.
    pub(crate) key: Cow<'r, str>,
    /// The lease's id (the client's, or one made here).
    pub(crate) lease: String,
    /// Whether a client chose the id (then a retry with it replaces the lease, and the
    /// node leaves a lease whose acquire failed to the client).
    own_id: bool,
    /// Slots to take.
    pub(crate) count: u32,
    /// Slots in flight allowed for the key.
    pub(crate) limit: u64,
    /// The lease's life.
    pub(crate) ttl: Duration,
    /// In shadow (its descriptor rule): its slots are taken past `limit` too, and the
    /// acquire is marked where `limit` would have refused it.
    pub(crate) shadow: bool,
    /// Envoy's (its outcome is recorded as a decision too).
    envoy: bool,
    /// More slots than the limit holds in all: not taken, over the limit.
    pub(crate) blocked: bool,
}

impl<'r> Acquiring<'r> {
    /// Stage 1 for a client's acquire of `key` on the namespace `name`: a concurrency
    /// namespace, the key, a count between 1 and the limit, the ttl, the lease id.
    pub(crate) fn of_request(
        ns: &'r Namespace,
        name: &str,
        key: &'r str,
        req: AcquireRequest,
    ) -> Result<Acquiring<'r>, Error> {
        let c = concurrency_of(ns, name)?;
        check_key(key)?;
        if req.count == 0 || u64::from(req.count) > c.limit {
            return Err(Error::BadRequest(format!(
                "count: {} is not between 1 and the namespace's limit {}",
                req.count, c.limit
            )));
        }
        let ttl = lease_ttl(req.ttl, &c)?;
        let own_id = req.lease.is_some();
        let lease = match req.lease {
            Some(id) => {
                check_lease_id(&id)?;
                id
            }
            None => new_lease_id(),
        };
        Ok(Acquiring {
            ns,
            key: Cow::Borrowed(key),
            lease,
            own_id,
            count: req.count,
            limit: c.limit,
            ttl,
            shadow: false,
            envoy: false,
            blocked: false,
        })
    }

    /// Envoy's acquire: `count` slots of `key` under `limit` for the namespace's
    /// `lease_ttl`, under a new lease of [`ENVOY_LEASES`] (ended by the same
    /// descriptors' negative hits).
    pub(crate) fn for_envoy(
        ns: &'r Namespace,
        c: &Concurrency,
        key: String,
        count: u32,
        limit: u64,
        shadow: bool,
    ) -> Acquiring<'r> {
        Acquiring {
            ns,
            key: Cow::Owned(key),
            lease: format!("{ENVOY_LEASES}{}", new_lease_id()),
            own_id: false,
            count,
            limit,
            ttl: c.lease_ttl,
            shadow,
            envoy: true,
            blocked: false,
        }
    }

    /// Whether its slots could ever fit: more than the limit holds in all is over it
    /// whatever is in flight (in shadow, taken anyway).
    pub(crate) fn fits(&self) -> bool {
        self.shadow || u64::from(self.count) <= self.limit
    }
}

impl Acquiring<'_> {
    /// Takes the slots if the key's live leases leave room under the limit — past it
    /// in shadow, marked then where the limit would have refused. A lease the node
    /// made that the store may have granted though the call failed is ended by the
    /// node (no client knows its id). A reply lost is sent again within
    /// `answer_timeout` (the same lease replaces itself); still unknown, 503
    /// `outcome_unknown`.
    pub(crate) async fn take(&self) -> Result<AcquireAnswer, Error> {
        let now = swin_sync::now();
        let expires_at = UnixMs(now.0.saturating_add(self.ttl.as_millis() as i64));
        let a = Acquire {
            key: &self.key,
            lease: &self.lease,
            count: self.count,
            limit: if self.shadow {
                MAX_CONCURRENCY
            } else {
                self.limit
            },
            expires_at,
            now,
        };
        let within = self.ns.leases.answer_within();
        let acquiring = self.ns.leases.acquire(a, within, "acquiring a lease").await;
        let acquired = match acquiring {
            Ok(acquired) => acquired,
            Err(e) => {
                let e = match self.own_id {
                    true => advised(e, "the lease may be held until its lapse: acquire again with the same lease id (it replaces itself and answers whether it is granted), or release it"),
                    false => advised(e, "if it was granted, this node ends it (no client knows its id): acquire again"),
                };
                if !self.own_id && e.is_store() {
                    // the store may have granted it before the call failed (a timeout)
                    tokio::spawn(undo_lease(
                        self.ns.leases.clone(),
                        self.key.to_string(),
                        self.lease.clone(),
                        expires_at,
                    ));
                }
                return Err(e);
            }
        };
        Ok(AcquireAnswer {
            shadow_denied: self.shadow && acquired.granted && acquired.in_flight > self.limit,
            acquired,
            lease: self.lease.clone(),
            limit: self.limit,
            expires_at,
            now,
        })
    }

    /// Ends the lease at once, or by a task retrying until the store answers.
    pub(crate) async fn undo(&self, taken: &AcquireAnswer) {
        let (leases, now) = (&self.ns.leases, swin_sync::now());
        let within = leases.answer_within();
        let ended = leases
            .release(&self.key, &taken.lease, now, within, "ending a lease")
            .await;
        if ended.is_err() {
            tokio::spawn(undo_lease(
                self.ns.leases.clone(),
                self.key.to_string(),
                taken.lease.clone(),
                taken.expires_at,
            ));
        }
    }

    /// Records its outcome (Envoy's: as a decision too).
    pub(crate) fn record(&self, taken: &AcquireAnswer) {
        let (recorder, name) = (self.ns.recorder(), self.ns.sync.name());
        let granted = taken.acquired.granted;
        recorder.lease(name, if granted { "acquired" } else { "denied" });
        if self.envoy {
            recorder.decision(name, "concurrency", granted, taken.shadow_denied);
        }
    }
}

/// The namespace's concurrency settings, or a 400 naming the mismatch.
pub(crate) fn concurrency_of(ns: &Namespace, name: &str) -> Result<Concurrency, Error> {
    ns.concurrency.ok_or_else(|| {
        Error::BadRequest(format!(
            "namespace {name:?} limits hits, not leases in flight (leases need algorithm = \"concurrency\")"
        ))
    })
}

/// Envoy's door: ends up to `count` slots of `key`'s leases taken by that door, the
/// earliest to lapse first; answers the slots ended (none when they lapsed).
pub(crate) async fn release_for_envoy(ns: &Namespace, key: &str, count: u32) -> Result<u32, Error> {
    ns.leases
        .release_slots(
            key,
            ENVOY_LEASES,
            count,
            swin_sync::now(),
            "releasing leases",
        )
        .await
}
