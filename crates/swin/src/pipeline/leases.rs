//! An acquire of slots as an ask of the pipeline (see [`super`]): checked when it is
//! made, taken through the namespace's lease book (shadow applied here and only here),
//! undone when its request is refused as a whole.

use std::borrow::Cow;
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::Acquire;

use super::Ask;
use crate::config::{Concurrency, MAX_CONCURRENCY};
use crate::error::Error;
use crate::leases::{
    check_lease_id, lease_ttl, new_lease_id, undo_lease, AcquireAnswer, AcquireRequest,
    ENVOY_LEASES,
};
use crate::policy::input::check_key;
use crate::state::Namespace;

/// An acquire of `count` slots of a key under a lease, on its way through the pipeline.
#[derive(Debug, Clone)]
pub struct Acquiring<'r> {
    /// Its namespace (a concurrency namespace).
    pub ns: &'r Namespace,
    /// The key whose slots it takes.
    pub key: Cow<'r, str>,
    /// The lease's id (the client's, or one made here).
    pub lease: String,
    /// Whether a client chose the id (then a retry with it replaces the lease, and the
    /// node leaves a lease whose acquire failed to the client).
    own_id: bool,
    /// Slots to take.
    pub count: u32,
    /// Slots in flight allowed for the key.
    pub limit: u64,
    /// The lease's life.
    pub ttl: Duration,
    /// In shadow (its descriptor rule): its slots are taken past `limit` too, and the
    /// acquire is marked where `limit` would have refused it.
    pub shadow: bool,
}

impl<'r> Acquiring<'r> {
    /// Stage 1 for a client's acquire of `key` on the namespace `name`: a concurrency
    /// namespace, the key, a count between 1 and the limit, the ttl, the lease id.
    pub fn of_request(
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
        })
    }

    /// Envoy's acquire: `count` slots of `key` under `limit` for the namespace's
    /// `lease_ttl`, under a new lease of [`ENVOY_LEASES`] (ended by the same
    /// descriptors' negative hits).
    pub fn for_envoy(
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
        }
    }

    /// Whether its slots could ever fit: more than the limit holds in all is over it
    /// whatever is in flight (in shadow, taken anyway).
    pub fn fits(&self) -> bool {
        self.shadow || u64::from(self.count) <= self.limit
    }
}

impl Ask for Acquiring<'_> {
    type Taken = AcquireAnswer;

    /// Takes the slots if the key's live leases leave room under the limit — past it
    /// in shadow, marked then where the limit would have refused. A lease the node
    /// made that the store may have granted though the call failed is ended by the
    /// node (no client knows its id).
    async fn take(&self, _dry_run: bool) -> Result<AcquireAnswer, Error> {
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
        let acquired = match self.ns.leases.acquire(a, "acquiring a lease").await {
            Ok(acquired) => acquired,
            Err(e) => {
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

    fn admitted(taken: &AcquireAnswer) -> bool {
        taken.acquired.granted
    }

    /// Ends the lease at once, or by a task retrying until the store answers.
    async fn undo(&self, taken: &AcquireAnswer) -> Result<(), Error> {
        let ended = self
            .ns
            .leases
            .end_or_renew(
                &self.key,
                &taken.lease,
                swin_sync::now(),
                None,
                "ending a lease",
            )
            .await;
        if ended.is_err() {
            tokio::spawn(undo_lease(
                self.ns.leases.clone(),
                self.key.to_string(),
                taken.lease.clone(),
                taken.expires_at,
            ));
        }
        Ok(())
    }
}

/// The namespace's concurrency settings, or a 400 naming the mismatch.
pub fn concurrency_of(ns: &Namespace, name: &str) -> Result<Concurrency, Error> {
    ns.concurrency.ok_or_else(|| {
        Error::BadRequest(format!(
            "namespace {name:?} limits hits, not leases in flight (leases need algorithm = \"concurrency\")"
        ))
    })
}

/// Takes `req.count` slots of `key` if the key's live leases leave room: the pipeline's
/// stages for one acquire ([`Acquiring`]). An acquire in a store is carried out to its
/// answer even when its caller goes away (and ended by the node if that answer was an
/// error), never cut off half-way.
pub async fn acquire(
    ns: &std::sync::Arc<Namespace>,
    name: &str,
    key: &str,
    req: AcquireRequest,
) -> Result<AcquireAnswer, Error> {
    let in_store = matches!(ns.leases, crate::leases::LeaseBook::Store(_));
    let (ns, name, key) = (ns.clone(), name.to_owned(), key.to_owned());
    super::to_the_end(in_store, async move {
        let a = Acquiring::of_request(&ns, &name, &key, req)?
            .take(false)
            .await?;
        let outcome = if a.acquired.granted {
            "acquired"
        } else {
            "denied"
        };
        ns.recorder().lease(&name, outcome);
        Ok(a)
    })
    .await
}

/// Envoy's door: ends up to `count` slots of `key`'s leases taken by that door, the
/// earliest to lapse first; answers the slots ended (none when they lapsed).
pub async fn release_for_envoy(ns: &Namespace, key: &str, count: u32) -> Result<u32, Error> {
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

/// Ends a live lease of `key`: its slots are free at once. 404 `unknown_lease` when it
/// is unknown, released or lapsed (nothing changes).
pub async fn release(ns: &Namespace, name: &str, key: &str, lease: &str) -> Result<(), Error> {
    let r = end_or_renew(ns, name, key, lease, None).await;
    record(ns, name, &r, "released");
    r.map(|_| ())
}

/// Moves a live lease's lapse to `ttl` from now; answers the new lapse time.
pub async fn renew(
    ns: &Namespace,
    name: &str,
    key: &str,
    lease: &str,
    ttl: Option<f64>,
) -> Result<UnixMs, Error> {
    let c = concurrency_of(ns, name)?;
    let ttl = lease_ttl(ttl, &c)?;
    let r = end_or_renew(ns, name, key, lease, Some(ttl)).await;
    record(ns, name, &r, "renewed");
    r
}

/// Records a release's or renewal's outcome: `done`, or `not_live`.
fn record<T>(ns: &Namespace, name: &str, r: &Result<T, Error>, done: &'static str) {
    match r {
        Ok(_) => ns.recorder().lease(name, done),
        Err(Error::UnknownLease(_)) => ns.recorder().lease(name, "not_live"),
        Err(_) => {}
    }
}

async fn end_or_renew(
    ns: &Namespace,
    name: &str,
    key: &str,
    lease: &str,
    ttl: Option<Duration>,
) -> Result<UnixMs, Error> {
    concurrency_of(ns, name)?;
    crate::policy::input::check_key(key)?;
    check_lease_id(lease)?;
    let now = swin_sync::now();
    let to = ttl.map(|t| UnixMs(now.0.saturating_add(t.as_millis() as i64)));
    let what = if to.is_some() {
        "renewing a lease"
    } else {
        "releasing a lease"
    };
    let done = ns.leases.end_or_renew(key, lease, now, to, what).await?;
    if !done {
        return Err(Error::UnknownLease(format!(
            "lease {lease:?} of key {key:?} is not live (released, lapsed or never granted); nothing was changed"
        )));
    }
    Ok(to.unwrap_or(now))
}
