//! Sharing what the proxies of Envoy's quota service ask for (see
//! [`crate::store::demands`]): the namespace's engine reads every node's entries and
//! posts this node's, through its store session (timeout, breaker, stop deadline).

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::Demands;
use crate::StoreError;

impl NamespaceSync {
    /// Every node's live entries for `buckets` at `now` (the store's time); a
    /// local-only namespace has none but this node's.
    pub async fn read_demands(
        &self,
        buckets: &[&str],
        now: UnixMs,
    ) -> Result<Vec<Demands>, StoreError> {
        match &self.session.store {
            Some(store) => {
                self.call(store.read_demands(self.name(), buckets, now))
                    .await
            }
            None => Ok(Vec::new()),
        }
    }

    /// Posts this node's `entries` (a local-only namespace keeps them to itself).
    pub async fn post_demands(&self, entries: &[Demands]) -> Result<(), StoreError> {
        match &self.session.store {
            Some(store) => self.call(store.post_demands(self.name(), entries)).await,
            None => Ok(()),
        }
    }
}
