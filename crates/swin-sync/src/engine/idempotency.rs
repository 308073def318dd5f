//! Idempotency records through a namespace's engine: its store, under its name, each
//! call bounded as a request's (see `store::idempotency`). Nothing is queued or synced: a
//! claim is one atomic step in the store. A namespace without a store keeps its records
//! in the node's memory, reached the same way ([`crate::store::MemoryStore`]).
//!
//! A claim whose store does not answer within `answer_within` is answered as a timeout
//! (its caller answers 503 and runs nothing), but the claim may still land: a script
//! already sent to a stalled Redis, a commit on its way. Left there it would hold the
//! record in flight for its whole hold, and every retry would get 409 until then. So the
//! call goes on in the background, and whatever it wrote is released once the store
//! answers (`release_given_up`), as a late synchronous increment is
//! settled when its round trip ends. Releasing is safe: nothing ran under the claim (its
//! caller was told it failed before running anything), and a release ends only the claim
//! of its own token, never one a retry took since.

use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;
use tracing::{debug, warn};

use super::NamespaceSync;
use crate::store::{Claim, Claimed, ClientShare};
use crate::StoreError;

/// The first pause between two tries of a release, doubled after each up to
/// [`RELEASE_PAUSE_MAX`] (short: a stopping engine waits for the tries to end).
const RELEASE_PAUSE: Duration = Duration::from_millis(100);
const RELEASE_PAUSE_MAX: Duration = Duration::from_secs(1);

/// A claim whose caller gave up on it: what its release needs.
struct GivenUp {
    key: String,
    token: i64,
    held_until: UnixMs,
}

/// What a claim whose caller gave up on it wrote, as far as this node can tell.
enum Landed {
    /// The record is the claim's: it goes.
    Mine,
    /// Nothing: it found another's record, the namespace full, or it never ran.
    Nothing,
    /// Its call failed where it may have run (cut short, its reply lost).
    Unknown,
}

impl From<Result<Claimed, StoreError>> for Landed {
    fn from(r: Result<Claimed, StoreError>) -> Landed {
        match r {
            Ok(Claimed::Mine) => Landed::Mine,
            Ok(Claimed::Found(_) | Claimed::Full | Claimed::ClientFull) => Landed::Nothing,
            Err(e) if e.may_have_run() => Landed::Unknown,
            Err(_) => Landed::Nothing,
        }
    }
}

impl NamespaceSync {
    /// Claims an idempotency record, waiting at most `answer_within` (then a timeout).
    /// When it fails, its caller runs nothing, and what the claim wrote or may still
    /// write is released in the background (see the module's note).
    pub async fn claim_idempotency(
        self: &Arc<Self>,
        claim: Claim<'_>,
    ) -> Result<Claimed, StoreError> {
        let (key, fingerprint) = (claim.key.to_owned(), *claim.fingerprint);
        let Claim {
            token,
            held_until,
            expires_at,
            now,
            max_records,
            client,
            ..
        } = claim;
        let client = client.map(|s| (s.client.to_owned(), s.max_records));
        let this = self.clone();
        // owned, so that it can go on once its caller has given up
        let mut call = Box::pin(async move {
            let store = this.records();
            let claim = Claim {
                key: &key,
                fingerprint: &fingerprint,
                token,
                held_until,
                expires_at,
                now,
                max_records,
                client: client.as_ref().map(|(client, max_records)| ClientShare {
                    client,
                    max_records: *max_records,
                }),
            };
            this.call(store.claim_idempotency(this.name(), claim)).await
        });
        let given_up = || {
            let c = GivenUp {
                key: claim.key.to_owned(),
                token,
                held_until,
            };
            (self.clone(), c)
        };
        let e = match tokio::time::timeout(self.session.answer_within, &mut call).await {
            Ok(Ok(claimed)) => return Ok(claimed),
            Ok(Err(e)) => {
                if e.may_have_run() {
                    let (this, given_up) = given_up();
                    self.flushes.spawn(async move {
                        this.release_given_up(Landed::Unknown, given_up).await
                    });
                }
                e
            }
            // the caller gives up; the call goes on, and what it wrote goes once it lands
            Err(_) => {
                let (this, given_up) = given_up();
                self.flushes.spawn(async move {
                    let landed = Landed::from(call.await);
                    this.release_given_up(landed, given_up).await
                });
                StoreError::Timeout(self.session.answer_within)
            }
        };
        if let StoreError::Timeout(_) = e {
            self.trip(&e);
        }
        Err(e)
    }

    /// Releases what a claim its caller gave up on wrote: the record it made, at once, or
    /// whatever it may have made, once the store answers again. Tries until the store
    /// answers, the claim lapses by itself, or the engine stops; a store known to be
    /// failing (the breaker is open) is not asked until a sync reaches it again.
    async fn release_given_up(&self, landed: Landed, c: GivenUp) {
        let mut ask_now = match landed {
            // the store just answered: release at once
            Landed::Mine => true,
            Landed::Nothing => return,
            Landed::Unknown => false,
        };
        let store = self.records();
        let mut pause = RELEASE_PAUSE;
        loop {
            if ask_now || !self.skipping_store() {
                match self
                    .call(store.release_claim(self.name(), &c.key, c.token))
                    .await
                {
                    Ok(released) => {
                        debug!(
                            namespace = self.name(),
                            record = c.key,
                            released,
                            "an idempotency claim failed to its caller: released"
                        );
                        return;
                    }
                    Err(e) => {
                        debug!(namespace = self.name(), cause = %e, "releasing a failed idempotency claim")
                    }
                }
            }
            ask_now = false;
            if self.flushes.is_closed() || super::now().0 >= c.held_until.0 {
                warn!(
                    namespace = self.name(),
                    record = c.key,
                    "an idempotency claim that failed to its caller could not be released: retries may get 409 until it lapses"
                );
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(RELEASE_PAUSE_MAX);
        }
    }

    /// Keeps `answer` (`Some`) or releases (`None`) the claim `token` of the record `key`;
    /// false when the claim is not held.
    pub async fn end_idempotency_claim(
        &self,
        key: &str,
        token: i64,
        answer: Option<&[u8]>,
        now: UnixMs,
    ) -> Result<bool, StoreError> {
        let store = self.records();
        let name = self.name();
        match answer {
            Some(a) => {
                self.call_for_request(store.keep_answer(name, key, token, a, now))
                    .await
            }
            None => {
                self.call_for_request(store.release_claim(name, key, token))
                    .await
            }
        }
    }

    /// The namespace's live idempotency records, as the store counts them.
    pub async fn idempotency_records(&self, now: UnixMs) -> Result<u64, StoreError> {
        let store = self.records();
        self.call_for_request(store.idempotency_records(self.name(), now))
            .await
    }
}
