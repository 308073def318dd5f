//! Where a namespace's idempotency records are kept, picked once when the namespace is
//! built: in its store (every call one atomic step there, bounded as a request's), or,
//! for a local-only namespace, in this node's memory ([`LocalRecords`]). Every record
//! call goes through it; nothing else asks where records live.

use std::sync::Arc;

use swin_core::UnixMs;
use swin_sync::store::{Claim, Claimed, IdempotencyStore};
use swin_sync::{NamespaceSync, StoreError};

use super::LocalRecords;
use crate::error::Error;

/// A namespace's idempotency records: its store's, or this node's.
#[derive(Debug, Clone)]
pub enum RecordBook {
    /// Kept in the namespace's store, through its engine.
    Store(Arc<NamespaceSync>),
    /// Kept on this node (a local-only namespace).
    Local(Arc<LocalRecords>),
}

impl RecordBook {
    /// The store of `sync` when it has one, else a table on this node.
    pub fn for_namespace(sync: &Arc<NamespaceSync>) -> RecordBook {
        match sync.store() {
            Some(_) => RecordBook::Store(sync.clone()),
            None => RecordBook::Local(Arc::default()),
        }
    }

    /// Whether every node sees its records (they are its store's).
    pub fn is_shared(&self) -> bool {
        matches!(self, RecordBook::Store(_))
    }

    /// Keeps the records of `old` where both are this node's (a rebuilt local-only
    /// namespace answers its retries as before); a store keeps its own.
    pub fn carry_from(&mut self, old: &RecordBook) {
        if let (RecordBook::Local(new), RecordBook::Local(old)) = (self, old) {
            *new = old.clone();
        }
    }

    /// Claims a record (see [`IdempotencyStore::claim_idempotency`]).
    pub async fn claim(&self, claim: Claim<'_>) -> Result<Claimed, Error> {
        match self {
            RecordBook::Store(sync) => stored(
                sync.claim_idempotency(claim).await,
                "claiming an idempotency key",
            ),
            RecordBook::Local(l) => local(l.claim_idempotency("", claim).await),
        }
    }

    /// Keeps `answer` (`Some`) or releases (`None`) the claim `token` of `key`; false
    /// when it is not held.
    pub async fn end(
        &self,
        key: &str,
        token: i64,
        answer: Option<&[u8]>,
        now: UnixMs,
    ) -> Result<bool, Error> {
        match self {
            RecordBook::Store(sync) => stored(
                sync.end_idempotency_claim(key, token, answer, now).await,
                "keeping an idempotent answer",
            ),
            RecordBook::Local(l) => local(match answer {
                Some(a) => l.keep_answer("", key, token, a, now).await,
                None => l.release_claim("", key, token).await,
            }),
        }
    }

    /// The namespace's live records (across the cluster, for a store).
    pub async fn records(&self, now: UnixMs) -> Result<u64, StoreError> {
        match self {
            RecordBook::Store(sync) => sync.idempotency_records(now).await.unwrap_or(Ok(0)),
            RecordBook::Local(l) => l.idempotency_records("", now).await,
        }
    }
}

/// A store call's answer as a request's: `None` (no store) never comes from a book
/// built with one.
fn stored<T>(r: Option<Result<T, StoreError>>, what: &str) -> Result<T, Error> {
    match r {
        Some(r) => r.map_err(|e| Error::store(&e, what)),
        None => {
            tracing::error!("{what}: a store-kept record book without a store");
            Err(Error::Internal)
        }
    }
}

/// A call on this node's records: they never fail.
fn local<T>(r: Result<T, StoreError>) -> Result<T, Error> {
    r.map_err(|e| Error::store(&e, "idempotency records kept on this node"))
}
