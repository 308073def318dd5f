//! Idempotent retries (see [`crate::idempotency`]): [`Limiter::once`] runs any request
//! at most once per idempotency key, whatever its kind, on any node:
//!
//! 1. the record is claimed in the namespace's store (one atomic put-if-absent): the
//!    first claim runs the request; a claim that finds the first answer answers it again
//!    (another fingerprint: [`Error::IdempotencyKeyReused`]); a claim that finds the
//!    first request still running asks again until the answer time
//!    (`answer_timeout`) is up, then answers [`Error::IdempotencyInProgress`];
//! 2. the request runs to its end in a task of its own (a caller going away does not
//!    leave a record claimed and a count made but no answer kept);
//! 3. its answer is kept, unless it is a failure of the node or the store (5xx): then
//!    the claim is released and a retry runs the request again.
//!
//! A claim that fails (the store down, or not answering within `answer_timeout`) is
//! answered as the store's failure, and nothing runs: the request runs only once its
//! claim is the caller's. What such a claim wrote all the same (a stalled store that
//! takes it once it wakes) is released by the engine in the background once the store
//! answers, so a retry then runs at once instead of finding it in flight; nothing ran
//! under it, and a release ends only its own claim.
//!
//! A claim whose holder never answers (its node stopped) holds the record for
//! [`CLAIM_HOLD`]; a retry after that runs the request again.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::{Claim, Claimed, ClientShare, Record};

use super::Limiter;
use crate::error::Error;
use crate::idempotency::{Answer, Idempotent, Once};
use crate::state::Namespace;

/// How long a claim holds its record without an answer.
pub const CLAIM_HOLD: Duration = Duration::from_secs(30);

/// A retry waiting for the first answer asks the store again this often.
const ASK_EVERY: Duration = Duration::from_millis(20);

/// How often a kept answer the store refused is tried again (until the claim's hold).
const KEEP_EVERY: Duration = Duration::from_millis(500);

impl Limiter {
    /// Runs `request` once for `asked`'s idempotency key in its namespace, within the
    /// namespace's `idempotency_ttl`: the first call runs it and answers
    /// [`Once::First`]; a retry with the same fingerprint answers [`Once::Again`] with the
    /// first answer, running and counting nothing. See the module's note for requests in
    /// flight, failures and the caps (`idempotency_max_keys`: [`Error::IdempotencyFull`];
    /// a client's share, `idempotency_max_keys_per_client`: [`Error::Exhausted`]).
    pub async fn once<F>(&self, asked: Idempotent, request: F) -> Result<Once, Error>
    where
        F: Future<Output = Answer> + Send + 'static,
    {
        let ns = self.namespace(&asked.namespace)?;
        // the claim, the request and the kept answer run to their end together
        tokio::spawn(once_in(ns, asked, request))
            .await
            .map_err(|e| {
                tracing::error!(cause = %e, "an idempotent request's task failed");
                Error::Internal
            })?
    }
}

impl Limiter {
    /// The namespace that keeps the record of a request over several namespaces (a
    /// batch), of which `namespaces` are the items' in order: the first whose records
    /// are kept in its store, where every node sees them. `None` when the request names
    /// no namespace or one that is not (it is refused by itself, keeping no record); a
    /// request whose namespaces are all local-only is refused ([`Error::BadRequest`]):
    /// its record would be kept on one node, and another would run it again.
    pub fn record_namespace<'a>(
        &self,
        namespaces: impl IntoIterator<Item = &'a str>,
    ) -> Result<Option<&'a str>, Error> {
        let mut local = Vec::new();
        for name in namespaces {
            let Ok(ns) = self.namespace(name) else {
                return Ok(None);
            };
            if ns.records.is_shared() {
                return Ok(Some(name));
            }
            local.push(name);
        }
        if local.is_empty() {
            return Ok(None);
        }
        Err(Error::BadRequest(format!(
            "Idempotency-Key: no item of this request is in a namespace with a store (only {}: local-only, counted on each node apart); its record would be kept on one node and run again on another: send it without the header, or with an item of a namespace with a store",
            local.join(", ")
        )))
    }
}

async fn once_in<F>(ns: Arc<Namespace>, asked: Idempotent, request: F) -> Result<Once, Error>
where
    F: Future<Output = Answer> + Send + 'static,
{
    let token: i64 = rand::random();
    let wait_until = tokio::time::Instant::now() + ns.sync.answer_within();
    loop {
        let now = swin_sync::now();
        let expires_at = after(now, ns.idempotency.ttl());
        let claim = Claim {
            key: &asked.record,
            fingerprint: &asked.fingerprint,
            token,
            held_until: after(now, CLAIM_HOLD).min(expires_at),
            expires_at,
            now,
            max_records: ns.idempotency.max_keys(),
            client: asked.client.as_ref().map(|c| ClientShare {
                client: c.as_str(),
                max_records: ns.idempotency.max_keys_per_client(),
            }),
        };
        match ns.records.claim(claim).await? {
            Claimed::Mine => {
                // its operations know they run once for this record (their retries are
                // the same operations: `crate::idempotency::identity_in_once`)
                let once = format!("{}\n{}", asked.namespace, asked.record);
                let answer = crate::idempotency::RUNNING_ONCE.scope(once, request).await;
                keep(&ns, &asked.record, token, &answer).await;
                return Ok(Once::First(answer));
            }
            Claimed::Found(r) if *r.fingerprint() != asked.fingerprint => {
                return Err(Error::IdempotencyKeyReused(format!(
                    "Idempotency-Key: {} was sent with another request (method, route or body) than the first one; a new request needs a new key",
                    key_of(&asked.record)
                )))
            }
            Claimed::Found(Record::Answered { answer, .. }) => {
                return match Answer::decode(&answer) {
                    Some(a) => Ok(Once::Again(a)),
                    None => {
                        tracing::error!(record = asked.record, "a kept answer does not read back");
                        Err(Error::Internal)
                    }
                };
            }
            Claimed::Found(Record::InFlight { .. }) => {
                if tokio::time::Instant::now() + ASK_EVERY > wait_until {
                    return Err(Error::IdempotencyInProgress(format!(
                        "Idempotency-Key: {}: the first request with it is still running; try again shortly",
                        key_of(&asked.record)
                    )));
                }
                tokio::time::sleep(ASK_EVERY).await;
            }
            Claimed::Full => {
                return Err(Error::IdempotencyFull(format!(
                    "namespace {:?} holds {} idempotency records (idempotency_max_keys); a new key is refused until some lapse",
                    asked.namespace,
                    ns.idempotency.max_keys()
                )))
            }
            Claimed::ClientFull => {
                return Err(Error::Exhausted(format!(
                    "this client holds {} idempotency records in namespace {:?} (idempotency_max_keys_per_client); its new keys are refused until some lapse",
                    ns.idempotency.max_keys_per_client(),
                    asked.namespace,
                )))
            }
        }
    }
}

/// Keeps `answer` for retries (or releases the claim, for a failure of the node or the
/// store); a store that refuses is asked again in the background while the claim holds.
async fn keep(ns: &Arc<Namespace>, record: &str, token: i64, answer: &Answer) {
    let bytes = answer.is_kept().then(|| answer.encode());
    let done = ns
        .records
        .end(record, token, bytes.as_deref(), swin_sync::now())
        .await;
    match done {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            record,
            "an idempotent request outlived its claim: its answer is not kept"
        ),
        Err(_) => {
            let until = tokio::time::Instant::now() + CLAIM_HOLD;
            let (ns, record) = (ns.clone(), record.to_owned());
            tokio::spawn(async move {
                while tokio::time::Instant::now() < until {
                    tokio::time::sleep(KEEP_EVERY).await;
                    let now = swin_sync::now();
                    if ns
                        .records
                        .end(&record, token, bytes.as_deref(), now)
                        .await
                        .is_ok()
                    {
                        return;
                    }
                }
                tracing::warn!(
                    record,
                    "an idempotent answer could not be kept: a retry after its claim runs again"
                );
            });
        }
    }
}

fn after(now: UnixMs, d: Duration) -> UnixMs {
    UnixMs(
        now.0
            .saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    )
}

/// The idempotency key of a record's key (`<len>:<route>:<key>`).
fn key_of(record: &str) -> &str {
    // a token's record begins with its client's id (24 hex digits) and `/`
    let record = match record.split_once('/') {
        Some((id, rest)) if id.len() == 24 && id.bytes().all(|b| b.is_ascii_hexdigit()) => rest,
        _ => record,
    };
    record
        .split_once(':')
        .and_then(|(len, rest)| rest.get(len.parse::<usize>().ok()? + 1..))
        .unwrap_or(record)
}
