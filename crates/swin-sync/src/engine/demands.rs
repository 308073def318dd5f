//! Sharing what the proxies of Envoy's quota service ask for (see
//! [`crate::store::demands`]): the namespace's engine posts this node's entries and
//! reads every node's, through its store session (timeout, breaker, stop deadline).

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::Demands;
use crate::StoreError;

impl NamespaceSync {
    /// Posts this node's `entries` and reads every node's live entries for `buckets`
    /// at `now` (the store's time). A local-only namespace shares nothing: it answers
    /// `entries` back.
    pub async fn share_demands(
        &self,
        entries: &[Demands],
        buckets: &[&str],
        now: UnixMs,
    ) -> Result<Vec<Demands>, StoreError> {
        let Some(store) = &self.session.store else {
            return Ok(entries.to_vec());
        };
        self.call(store.post_demands(self.name(), entries)).await?;
        self.call(store.read_demands(self.name(), buckets, now))
            .await
    }
}
