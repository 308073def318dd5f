//! A namespace's idempotency records, as its requests see them: every record call goes
//! through its [`RecordBook`], to its engine and the store that keeps them — its own
//! (every call one atomic step there, bounded as a request's), or, for a local-only
//! namespace, the node's memory ([`swin_sync::store::MemoryStore`], under the same
//! contract). Nothing here asks where they live.

use std::sync::Arc;

use swin_core::UnixMs;
use swin_sync::store::{Claim, Claimed};
use swin_sync::NamespaceSync;

use crate::error::Error;

/// A namespace's idempotency records, through its engine.
#[derive(Debug, Clone)]
pub struct RecordBook(Arc<NamespaceSync>);

impl RecordBook {
    /// The records of the namespace `sync` runs.
    pub fn for_namespace(sync: &Arc<NamespaceSync>) -> RecordBook {
        RecordBook(sync.clone())
    }

    /// Whether every node sees its records (they are its store's).
    pub fn is_shared(&self) -> bool {
        self.0.records_shared()
    }

    /// The node's memory that keeps them (a local-only namespace).
    pub fn memory(&self) -> Option<&swin_sync::store::MemoryStore> {
        self.0.memory()
    }

    /// Claims a record (see
    /// [`IdempotencyStore::claim_idempotency`](swin_sync::store::IdempotencyStore::claim_idempotency)).
    pub async fn claim(&self, claim: Claim<'_>) -> Result<Claimed, Error> {
        let claimed = self.0.claim_idempotency(claim).await;
        claimed.map_err(|e| Error::store(&e, "claiming an idempotency key"))
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
        let ended = self.0.end_idempotency_claim(key, token, answer, now).await;
        ended.map_err(|e| Error::store(&e, "keeping an idempotent answer"))
    }
}
