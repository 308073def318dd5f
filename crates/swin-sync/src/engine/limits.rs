//! Runtime limits through a namespace's engine: its store, under its name, each call
//! bounded by its store timeout (a store that hangs costs a timeout, not a request's
//! life). The node keeps and reads the limits; this only carries them.

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::{LimitChanges, StoredLimit};
use crate::StoreError;

impl NamespaceSync {
    /// Whether the namespace keeps runtime limits in a store (otherwise on this node).
    pub fn keeps_limits_in_store(&self) -> bool {
        self.session.store.is_some()
    }

    /// Whether the store is known to be failing (requests answer from what the node
    /// knows until a sync succeeds): a caller that can do without the store skips it.
    pub fn store_failing(&self) -> bool {
        self.skipping_store()
    }

    /// A read beside the admission failed: requests answer from what the node knows
    /// until a sync reaches the store again, as after a failed synchronous call (so a
    /// request does not wait a second store timeout in its admission).
    pub fn store_failed(&self, e: &StoreError) {
        self.trip(e);
    }

    /// Sets a key's limits in the store. No store: nothing to do. An operator's change
    /// waits up to `within` (the caller's: it is no decision, `answer_within` does not
    /// bound it), and the store applies it only before `deadline_within` of that by its
    /// own clock: an error that did not [may have run](StoreError::may_have_run) means
    /// nothing changed; one that may have (a lost reply) is resolved by sending the same
    /// limits again, which sets the same.
    pub async fn put_limit(
        &self,
        limit: &StoredLimit,
        within: std::time::Duration,
    ) -> Result<(), StoreError> {
        match &self.session.store {
            Some(store) => {
                let not_after = self.deadline_within(within);
                let put = store.put_limit(self.name(), limit, not_after);
                self.call_within(within, put).await
            }
            None => Ok(()),
        }
    }

    /// Removes a key's limits from the store; false when it had none (or no store). As
    /// [`Self::put_limit`]: an error that may have run may have removed them (sent
    /// again, it answers false then).
    pub async fn delete_limit(
        &self,
        key: &str,
        within: std::time::Duration,
    ) -> Result<bool, StoreError> {
        match &self.session.store {
            Some(store) => {
                let not_after = self.deadline_within(within);
                let delete = store.delete_limit(self.name(), key, not_after);
                self.call_within(within, delete).await
            }
            None => Ok(false),
        }
    }

    /// The store time after which a change sent now, whose caller waits `wait`, is not
    /// applied: nine tenths of the wait from now, so that a change the store applies in
    /// time has the rest (at least tens of milliseconds) to answer before its caller gives
    /// up and says nothing changed.
    pub(crate) fn deadline_within(&self, wait: std::time::Duration) -> UnixMs {
        let ms = i64::try_from(wait.as_millis() * 9 / 10).unwrap_or(i64::MAX);
        UnixMs(crate::now().0.saturating_add(ms))
    }

    /// The stored limits of those of `keys` that have some.
    pub async fn read_limits(&self, keys: &[&str]) -> Result<Vec<StoredLimit>, StoreError> {
        match &self.session.store {
            Some(store) => {
                self.call_for_request(store.read_limits(self.name(), keys))
                    .await
            }
            None => Ok(Vec::new()),
        }
    }

    /// A page of the namespace's live limits in key order.
    pub async fn list_limits(
        &self,
        after: Option<&str>,
        count: usize,
        now: UnixMs,
    ) -> Result<Vec<StoredLimit>, StoreError> {
        match &self.session.store {
            Some(store) => {
                self.call(store.list_limits(self.name(), after, count, now))
                    .await
            }
            None => Ok(Vec::new()),
        }
    }

    /// The keys whose limits changed after `since` (see [`crate::store::LimitStore`]).
    pub async fn limit_changes(&self, since: Option<&str>) -> Result<LimitChanges, StoreError> {
        match &self.session.store {
            Some(store) => self.call(store.limit_changes(self.name(), since)).await,
            None => Ok(LimitChanges {
                keys: Vec::new(),
                cursor: String::new(),
                complete: true,
            }),
        }
    }

    /// Whether any counter table or the buckets hold `key` (a key this node serves).
    pub fn serves(&self, key: &str) -> bool {
        self.holds(key)
    }
}
