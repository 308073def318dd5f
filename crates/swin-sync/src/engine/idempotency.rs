//! Idempotency records through a namespace's engine: its store, under its name, each
//! call bounded as a request's (see `store::idempotency`). Nothing is queued or synced: a
//! claim is one atomic step in the store. A namespace without a store keeps its records
//! on the node (the `swin` library's own table).

use swin_core::UnixMs;

use super::NamespaceSync;
use crate::store::{Claim, Claimed};
use crate::StoreError;

impl NamespaceSync {
    /// Claims an idempotency record. `None`: the namespace has no store.
    pub async fn claim_idempotency(&self, claim: Claim<'_>) -> Option<Result<Claimed, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.claim_idempotency(self.name(), claim))
                .await,
        )
    }

    /// Keeps `answer` (`Some`) or releases (`None`) the claim `token` of the record `key`;
    /// false when the claim is not held. `None`: no store.
    pub async fn end_idempotency_claim(
        &self,
        key: &str,
        token: i64,
        answer: Option<&[u8]>,
        now: UnixMs,
    ) -> Option<Result<bool, StoreError>> {
        let store = self.session.store.as_ref()?;
        let name = self.name();
        Some(match answer {
            Some(a) => {
                self.call_for_request(store.keep_answer(name, key, token, a, now))
                    .await
            }
            None => {
                self.call_for_request(store.release_claim(name, key, token))
                    .await
            }
        })
    }

    /// The namespace's live idempotency records, as the store counts them. `None`: no
    /// store.
    pub async fn idempotency_records(&self, now: UnixMs) -> Option<Result<u64, StoreError>> {
        let store = self.session.store.as_ref()?;
        Some(
            self.call_for_request(store.idempotency_records(self.name(), now))
                .await,
        )
    }
}
