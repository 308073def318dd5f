//! A namespace's leases, as its requests see them: every lease call of every door goes
//! through its [`LeaseBook`], to its engine and the store that keeps them — its own, each
//! call one atomic step there bounded by `answer_timeout`, or, for a local-only
//! namespace, the node's memory ([`swin_sync::store::MemoryStore`], under the same
//! contract). Nothing here asks where they live.
//!
//! A change whose store reply is lost is sent again (the same acquire, the same
//! release operation, the renewal to the same lapse) until the store answers, within
//! the time its caller gives; still unknown then, it is [`Error::OutcomeUnknown`] (its
//! caller says what the client does about it). A call that outwaited its time is
//! unknown too: its deadline keeps the store from applying it later, but the store may
//! have applied it in time and its reply come late.

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::{new_op, Acquire, Acquired, Released};
use swin_sync::{NamespaceSync, StoreError};

use crate::error::Error;
use crate::known::{until_known, Outcome};

/// A namespace's leases, through its engine.
#[derive(Debug, Clone)]
pub struct LeaseBook(Arc<NamespaceSync>);

impl LeaseBook {
    /// The leases of the namespace `sync` runs.
    pub fn for_namespace(sync: &Arc<NamespaceSync>) -> LeaseBook {
        LeaseBook(sync.clone())
    }

    /// Whether every node sees them (they are the namespace's store's).
    pub fn is_shared(&self) -> bool {
        self.0.records_shared()
    }

    /// How long a lease call of a request waits for the store (`answer_timeout`; the
    /// node's memory answers at once, and once: a full table is not asked again).
    pub fn answer_within(&self) -> Duration {
        match self.is_shared() {
            true => self.0.answer_within(),
            false => Duration::ZERO,
        }
    }

    /// Takes `a.count` slots of `a.key` if its live leases leave room under `a.limit`,
    /// waiting for the store at most `within` (sent again while its reply is lost: the
    /// same lease replaces itself). `what` names the call in a store error.
    pub async fn acquire(
        &self,
        a: Acquire<'_>,
        within: Duration,
        what: &str,
    ) -> Result<Acquired, Error> {
        let sync = &self.0;
        let r = until_known(within, |w| sync.acquire_lease(a, w)).await;
        known(r, what)
    }

    /// Ends the live lease `lease` of `key` as one operation (sent again while its reply
    /// is lost), waiting for the store at most `within`: [`Released::Now`] when this
    /// call ended it, [`Released::Before`] when another release did (lately).
    pub async fn release(
        &self,
        key: &str,
        lease: &str,
        now: UnixMs,
        within: Duration,
        what: &str,
    ) -> Result<Released, Error> {
        let (op, sync) = (new_op(), &self.0);
        let r = until_known(within, |w| sync.release_lease(key, lease, &op, now, w)).await;
        known(r, what)
    }

    /// Moves the lapse of the live lease `lease` of `key` to `to` (sent again while its
    /// reply is lost: to the same time), waiting for the store at most `within`; false
    /// when it is not live.
    pub async fn renew(
        &self,
        key: &str,
        lease: &str,
        to: UnixMs,
        now: UnixMs,
        within: Duration,
        what: &str,
    ) -> Result<bool, Error> {
        let sync = &self.0;
        let r = until_known(within, |w| sync.renew_lease(key, lease, to, now, w)).await;
        known(r, what)
    }

    /// Ends up to `count` slots of `key`'s live leases whose ids begin with `prefix`,
    /// earliest lapse first; answers the slots ended. Sent once: a reply lost is
    /// [`Error::OutcomeUnknown`] (the slots may have been ended).
    pub async fn release_slots(
        &self,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
        what: &str,
    ) -> Result<u32, Error> {
        match self.0.release_lease_slots(key, prefix, count, now).await {
            Ok(n) => Ok(n),
            // never sent again: it ends slots by count, not by lease, and a second
            // attempt would end as many more (one that timed out may have been
            // applied in time, its reply late)
            Err(e) if e.may_have_run() => {
                tracing::warn!(cause = %e, "{what}");
                Err(Error::OutcomeUnknown(format!(
                    "{what}: the store may have ended the slots, but its reply was lost; they are not ended again (that would end other requests' slots): slots not ended lapse by the lease ttl"
                )))
            }
            Err(e) => Err(Error::store(&e, what)),
        }
    }

    /// The slots of the namespace's live leases (across the cluster, for a store); the
    /// store's error as it is (a scrape logs it quietly: no request waits on it).
    pub async fn in_flight(&self, now: UnixMs) -> Result<u64, swin_sync::StoreError> {
        self.0.leases_in_flight(now).await
    }
}

/// A change sent until the store answered, as a request's answer: unknown, an
/// [`Error::OutcomeUnknown`] its caller adds to (see [`super::advised`]).
fn known<T>(r: Outcome<T>, what: &str) -> Result<T, Error> {
    match r {
        Outcome::Known(v) => Ok(v),
        // the node's own table is full: a 503, try again later
        Outcome::NotApplied(StoreError::Full(m)) => Err(Error::Unavailable(m)),
        Outcome::NotApplied(e) => Err(Error::store(&e, what)),
        Outcome::Unknown(e) => {
            tracing::warn!(cause = %e, "{what}: the outcome is unknown");
            Err(Error::OutcomeUnknown(format!(
                "{what}: the store may have applied it, but its reply was lost and asking again within answer_timeout did not tell"
            )))
        }
    }
}
