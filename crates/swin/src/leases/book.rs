//! Where a namespace's leases (and reservations' records) are kept, picked once when the
//! namespace is built: in its store (every call one atomic step there, bounded by
//! `answer_timeout`), or, for a local-only namespace, in this node's memory
//! ([`LocalLeases`], a memory backend of the same [`LeaseStore`] interface). Every
//! lease call of every door goes through it; nothing else asks where leases live.

use std::sync::Arc;

use swin_core::UnixMs;
use swin_sync::store::{Acquire, Acquired, LeaseStore};
use swin_sync::NamespaceSync;

use super::LocalLeases;
use crate::error::Error;

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

    /// Takes `a.count` slots of `a.key` if its live leases leave room under `a.limit`.
    /// `what` names the call in a store error.
    pub async fn acquire(&self, a: Acquire<'_>, what: &str) -> Result<Acquired, Error> {
        match self {
            LeaseBook::Store(sync) => stored(sync.acquire_lease(a).await, what),
            LeaseBook::Local(l) => local(l.acquire("", a).await),
        }
    }

    /// Ends (`renew_to: None`) or renews the live lease `lease` of `key`; false when it
    /// is not live.
    pub async fn end_or_renew(
        &self,
        key: &str,
        lease: &str,
        now: UnixMs,
        renew_to: Option<UnixMs>,
        what: &str,
    ) -> Result<bool, Error> {
        match self {
            LeaseBook::Store(sync) => stored(
                sync.end_or_renew_lease(key, lease, now, renew_to).await,
                what,
            ),
            LeaseBook::Local(l) => local(match renew_to {
                None => l.release("", key, lease, now, now).await,
                Some(to) => l.renew("", key, lease, to, now, now).await,
            }),
        }
    }

    /// Ends up to `count` slots of `key`'s live leases whose ids begin with `prefix`,
    /// earliest lapse first; answers the slots ended.
    pub async fn release_slots(
        &self,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
        what: &str,
    ) -> Result<u32, Error> {
        match self {
            LeaseBook::Store(sync) => stored(
                sync.release_lease_slots(key, prefix, count, now).await,
                what,
            ),
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

/// A store call's answer as a request's: `None` (no store) never comes from a book
/// built with one.
fn stored<T>(r: Option<Result<T, swin_sync::StoreError>>, what: &str) -> Result<T, Error> {
    match r {
        Some(r) => r.map_err(|e| Error::store(&e, what)),
        None => {
            tracing::error!("{what}: a store-kept lease book without a store");
            Err(Error::Internal)
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
