//! Concurrency leases (`algorithm = "concurrency"`): at most `limit` slots in flight per
//! key. An acquire takes slots under a lease id until the lease's lapse time; a release
//! gives them back at once; a renewal moves the lapse. The doors (HTTP, Envoy's negative
//! hits) all come here.
//!
//! Where leases live: a namespace with a store keeps them in it (every acquire, release
//! and renewal is one atomic step there, whatever the sync rate — see
//! [`swin_sync::store::LeaseStore`]), so a slot released on one node is free on every other
//! at once and no interleaving of nodes passes the limit; a node that dies frees its
//! leases by their lapse. A local-only namespace keeps them in the node's memory
//! ([`swin_sync::store::MemoryStore`], under the same contract).
//! A store that cannot be asked refuses the acquire (503): admitting without it could
//! pass the limit.
//! Either way the calls below go through the namespace's [`LeaseBook`], picked once when
//! the namespace is built.

mod book;
mod records;

use std::time::{Duration, SystemTime};

use swin_core::UnixMs;
use swin_sync::store::Acquired;

use crate::config::Concurrency;
use crate::error::Error;
use crate::policy::system_time;

pub(crate) use self::book::LeaseBook;
pub(crate) use self::records::ReservationBook;

/// The longest lease id a client may choose.
pub const MAX_LEASE_ID_BYTES: usize = 128;

/// A granted or refused acquire, with what a client is told: a document, serialized as
/// the daemon answers it (granted: `allowed`, `lease`, `in_flight`, `limit`,
/// `expires_at` in Unix seconds; refused: `allowed`, `in_flight`, `limit`,
/// `retry_after` in seconds), and its headers.
#[derive(Debug, Clone)]
pub struct AcquireAnswer {
    /// What the store or this node's table granted or refused, with the slots in flight.
    pub(crate) acquired: Acquired,
    /// The lease's id (the client's, or one made here).
    pub(crate) lease: String,
    /// Slots in flight allowed for the key.
    pub(crate) limit: u64,
    /// When the lease lapses (store time).
    pub(crate) expires_at: UnixMs,
    /// The time the acquire was decided at (store time).
    pub(crate) now: UnixMs,
    /// Granted only because its limit is in shadow (the limit would have refused it).
    pub(crate) shadow_denied: bool,
}

impl AcquireAnswer {
    /// The slots were granted (under [`lease`](AcquireAnswer::lease)).
    pub fn allowed(&self) -> bool {
        self.acquired.granted
    }

    /// The lease's id (the client's, or one made here): what a release or a renewal
    /// names.
    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// When the lease lapses (store time).
    pub fn expires_at(&self) -> SystemTime {
        system_time(self.expires_at)
    }

    /// Seconds until a slot is sure to be free (a denied acquire: the earliest lapse of
    /// a live lease), at least a millisecond.
    pub(crate) fn retry_after_secs(&self) -> f64 {
        let at = self.acquired.earliest_lapse.unwrap_or(self.expires_at);
        ((at.0 - self.now.0).max(1)) as f64 / 1e3
    }

    /// The headers its answer carries, by name: `RateLimit-Policy` (`"concurrency";q=`
    /// the limit), `RateLimit` (the slots left, and `t` when refused) and, when refused,
    /// `Retry-After`.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        crate::policy::headers::of_slots(
            self.limit,
            self.acquired.in_flight,
            !self.acquired.granted,
            self.retry_after_secs(),
        )
    }
}

impl serde::Serialize for AcquireAnswer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(5))?;
        m.serialize_entry("allowed", &self.acquired.granted)?;
        if self.acquired.granted {
            m.serialize_entry("lease", &self.lease)?;
        }
        m.serialize_entry("in_flight", &self.acquired.in_flight)?;
        m.serialize_entry("limit", &self.limit)?;
        match self.acquired.granted {
            // whole milliseconds, as the store keeps them
            true => m.serialize_entry("expires_at", &(self.expires_at.0 as f64 / 1e3))?,
            false => m.serialize_entry("retry_after", &self.retry_after_secs())?,
        }
        m.end()
    }
}

/// What an acquire asks for, as read from a door.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Slots to take (1 for one request).
    pub(crate) count: u32,
    /// The lease's life (the namespace's `lease_ttl` unless the client says).
    pub(crate) ttl: Option<f64>,
    /// A client's own id, so that a retried acquire (a lost answer) replaces itself.
    pub(crate) lease: Option<String>,
}

impl AcquireRequest {
    /// An acquire of `count` slots for `ttl` seconds (the namespace's `lease_ttl` when
    /// `None`), under the client's own `lease` id if it chose one (then a retry with it
    /// replaces the lease).
    pub fn new(count: u32, ttl: Option<f64>, lease: Option<String>) -> AcquireRequest {
        AcquireRequest { count, ttl, lease }
    }
}

/// A lease's life: `ttl` seconds if given (a millisecond ≤ ttl ≤ a day: a shorter one would lapse before it is granted), else the namespace's.
pub fn lease_ttl(ttl: Option<f64>, c: &Concurrency) -> Result<Duration, Error> {
    use crate::config::{MAX_LEASE_TTL_SECS, MIN_TTL_SECS};
    match ttl {
        None => Ok(c.lease_ttl),
        Some(t) if (MIN_TTL_SECS..=MAX_LEASE_TTL_SECS).contains(&t) => {
            Ok(Duration::from_secs_f64(t))
        }
        Some(t) => Err(Error::BadRequest(format!(
            "ttl: {t} is not a number of seconds from {MIN_TTL_SECS} (a millisecond) to {MAX_LEASE_TTL_SECS}"
        ))),
    }
}

/// A lease id a client gave: 1 to 128 bytes of letters, digits, `.`, `_`, `-` and `~`.
pub fn check_lease_id(id: &str) -> Result<(), Error> {
    let ok = !id.is_empty()
        && id.len() <= MAX_LEASE_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'~'));
    if ok {
        Ok(())
    } else {
        Err(Error::BadRequest(format!(
            "lease: must be 1 to {MAX_LEASE_ID_BYTES} bytes of letters, digits, '.', '_', '-' and '~'"
        )))
    }
}

/// A new lease id: 128 random bits in hex.
pub(crate) fn new_lease_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn now() -> UnixMs {
    swin_sync::now()
}

/// The prefix of the leases Envoy's door takes. Envoy names no lease when a request
/// ends (it sends the same descriptors with `is_negative_hits`), so its releases end the
/// key's leases under this prefix, the earliest to lapse first; the HTTP door's ids
/// (hex, or a client's own) are never ended that way unless a client picks this prefix.
pub const ENVOY_LEASES: &str = "envoy.";

/// Ends a lease an acquire may have taken though it answered an error, retrying until
/// the store answers or the lease would have lapsed anyway. (A client's own id is left
/// alone: the client retries with it, and the retry replaces it.)
pub(crate) async fn undo_lease(book: LeaseBook, key: String, lease: String, expires_at: UnixMs) {
    while now() < expires_at {
        let within = book.answer_within();
        match book
            .release(&key, &lease, now(), within, "ending a lease")
            .await
        {
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            Ok(_) => return,
        }
    }
}

/// `e` with what the client does about it, when its outcome is unknown (see
/// [`LeaseBook`]); any other error as it is.
pub(crate) fn advised(e: Error, advice: &str) -> Error {
    match e {
        Error::OutcomeUnknown(m) => Error::OutcomeUnknown(format!("{m}: {advice}")),
        e => e,
    }
}
