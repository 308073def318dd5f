//! Where a namespace's leases (and reservations' records) are kept, picked once when the
//! namespace is built: in its store (every call one atomic step there, bounded by
//! `answer_timeout`), or, for a local-only namespace, in this node's memory
//! ([`LocalLeases`], a memory backend of the same [`LeaseStore`] interface). Every
//! lease call of every door goes through it; nothing else asks where leases live.
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
use swin_sync::store::{new_op, Acquire, Acquired, LeaseStore, Released};
use swin_sync::{NamespaceSync, StoreError};

use super::LocalLeases;
use crate::error::Error;
use crate::known::{until_known, Outcome};

/// A namespace's leases: its store's, or this node's.
#[derive(Debug, Clone)]
pub enum LeaseBook {
    /// Kept in the namespace's store, through its engine.
    Store(Arc<NamespaceSync>),
    /// Kept on this node (a local-only namespace).
    Local(Arc<LocalLeases>),
}

impl LeaseBook {
    /// The store of `sync` when it has one, else a table on this node of at most
    /// `max_keys` keys.
    pub fn for_namespace(sync: &Arc<NamespaceSync>, max_keys: usize) -> LeaseBook {
        match sync.store() {
            Some(_) => LeaseBook::Store(sync.clone()),
            None => LeaseBook::Local(Arc::new(LocalLeases::new(max_keys))),
        }
    }

    /// Keeps the leases of `old` where both are this node's (a rebuilt local-only
    /// namespace: a new table would let a limit's worth more in); a store keeps its own.
    pub fn carry_from(&mut self, old: &LeaseBook) {
        if let (LeaseBook::Local(new), LeaseBook::Local(old)) = (self, old) {
            *new = old.clone();
        }
    }

    /// How long a lease call of a request waits for the store (`answer_timeout`).
    pub fn answer_within(&self) -> Duration {
        match self {
            LeaseBook::Store(sync) => sync.answer_within(),
            LeaseBook::Local(_) => Duration::ZERO,
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
        match self {
            LeaseBook::Store(sync) => {
                let r = until_known(within, |w| async move {
                    no_store(sync.acquire_lease(a, w).await)
                })
                .await;
                known(r, what)
            }
            LeaseBook::Local(l) => local(l.acquire("", a, a.now).await),
        }
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
        let op = new_op();
        match self {
            LeaseBook::Store(sync) => {
                let r = until_known(within, |w| {
                    let op = &op;
                    async move { no_store(sync.release_lease(key, lease, op, now, w).await) }
                })
                .await;
                known(r, what)
            }
            LeaseBook::Local(l) => local(l.release("", key, lease, &op, now, now).await),
        }
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
        match self {
            LeaseBook::Store(sync) => {
                let r = until_known(within, |w| async move {
                    no_store(sync.renew_lease(key, lease, to, now, w).await)
                })
                .await;
                known(r, what)
            }
            LeaseBook::Local(l) => local(l.renew("", key, lease, to, now, now).await),
        }
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
        match self {
            LeaseBook::Store(sync) => {
                match no_store(sync.release_lease_slots(key, prefix, count, now).await) {
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
            LeaseBook::Local(l) => local(l.release_slots("", key, prefix, count, now, now).await),
        }
    }

    /// The slots of the namespace's live leases (across the cluster, for a store); the
    /// store's error as it is (a scrape logs it quietly: no request waits on it).
    pub async fn in_flight(&self, now: UnixMs) -> Result<u64, swin_sync::StoreError> {
        match self {
            LeaseBook::Store(sync) => sync.leases_in_flight(now).await.unwrap_or(Ok(0)),
            LeaseBook::Local(l) => l.in_flight("", now).await,
        }
    }
}

/// A store call made through a book built with a store (`None`, no store, never comes).
fn no_store<T>(r: Option<Result<T, StoreError>>) -> Result<T, StoreError> {
    r.unwrap_or_else(|| Err(StoreError::Unavailable("no store".into())))
}

/// A change sent until the store answered, as a request's answer: unknown, an
/// [`Error::OutcomeUnknown`] its caller adds to (see [`super::advised`]).
fn known<T>(r: Outcome<T>, what: &str) -> Result<T, Error> {
    match r {
        Outcome::Known(v) => Ok(v),
        Outcome::NotApplied(e) => Err(Error::store(&e, what)),
        Outcome::Unknown(e) => {
            tracing::warn!(cause = %e, "{what}: the outcome is unknown");
            Err(Error::OutcomeUnknown(format!(
                "{what}: the store may have applied it, but its reply was lost and asking again within answer_timeout did not tell"
            )))
        }
    }
}

/// A call on this node's leases as a request's answer: the one failure it has is a full
/// table (a 503, try again later).
fn local<T>(r: Result<T, swin_sync::StoreError>) -> Result<T, Error> {
    r.map_err(|e| match e {
        swin_sync::StoreError::Unavailable(m) => Error::Unavailable(m),
        e => Error::store(&e, "leases kept on this node"),
    })
}
