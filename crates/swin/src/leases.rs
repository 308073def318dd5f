//! Concurrency leases (`algorithm = "concurrency"`): at most `limit` slots in flight per
//! key. An acquire takes slots under a lease id until the lease's lapse time; a release
//! gives them back at once; a renewal moves the lapse. The doors (HTTP, Envoy's negative
//! hits) all come here.
//!
//! Where leases live: a namespace with a store keeps them in it (every acquire, release
//! and renewal is one atomic step there, whatever the sync rate — see
//! [`swin_sync::store::Leases`]), so a slot released on one node is free on every other
//! at once and no interleaving of nodes passes the limit; a node that dies frees its
//! leases by their lapse. A local-only namespace keeps them here, in [`LocalLeases`].
//! A store that cannot be asked refuses the acquire (503): admitting without it could
//! pass the limit.
//!
//! Over 500 lines: the lease calls of every door and the local-only table they fall back
//! to are one contract (the same acquire, release and lapse rules with or without a
//! store), kept in one file so that the two sides read against each other.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use swin_core::UnixMs;
use swin_sync::store::{Acquire, Acquired};

use crate::config::Concurrency;
use crate::error::Error;
use crate::state::Namespace;

/// The longest lease id a client may choose.
pub const MAX_LEASE_ID_BYTES: usize = 128;

/// A granted or refused acquire, with what a client is told.
#[derive(Debug, Clone)]
pub struct AcquireAnswer {
    pub acquired: Acquired,
    /// The lease's id (the client's, or one made here).
    pub lease: String,
    pub limit: u64,
    pub expires_at: UnixMs,
    pub now: UnixMs,
}

impl AcquireAnswer {
    /// Seconds until a slot is sure to be free (a denied acquire: the earliest lapse of
    /// a live lease), at least a millisecond.
    pub fn retry_after_secs(&self) -> f64 {
        let at = self.acquired.earliest_lapse.unwrap_or(self.expires_at);
        ((at.0 - self.now.0).max(1)) as f64 / 1e3
    }
}

/// What an acquire asks for, as read from a door.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    pub count: u32,
    /// The lease's life (the namespace's `lease_ttl` unless the client says).
    pub ttl: Option<f64>,
    /// A client's own id, so that a retried acquire (a lost answer) replaces itself.
    pub lease: Option<String>,
}

/// The namespace's concurrency settings, or a 400 naming the mismatch.
pub fn concurrency_of(ns: &Namespace, name: &str) -> Result<Concurrency, Error> {
    ns.concurrency.ok_or_else(|| {
        Error::BadRequest(format!(
            "namespace {name:?} limits hits, not leases in flight (leases need algorithm = \"concurrency\")"
        ))
    })
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
pub fn new_lease_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn now() -> UnixMs {
    swin_sync::now()
}

/// Takes `req.count` slots of `key` if the key's live leases leave room.
pub async fn acquire(
    ns: &Namespace,
    name: &str,
    key: &str,
    req: AcquireRequest,
) -> Result<AcquireAnswer, Error> {
    let c = concurrency_of(ns, name)?;
    crate::policy::input::check_key(key)?;
    if req.count == 0 || u64::from(req.count) > c.limit {
        return Err(Error::BadRequest(format!(
            "count: {} is not between 1 and the namespace's limit {}",
            req.count, c.limit
        )));
    }
    let ttl = lease_ttl(req.ttl, &c)?;
    let own_id = req.lease.is_some();
    let lease = match req.lease {
        Some(id) => {
            check_lease_id(&id)?;
            id
        }
        None => new_lease_id(),
    };
    take(ns, key, lease, own_id, req.count, c.limit, ttl).await
}

/// The prefix of the leases Envoy's door takes. Envoy names no lease when a request
/// ends (it sends the same descriptors with `is_negative_hits`), so its releases end the
/// key's leases under this prefix, the earliest to lapse first; the HTTP door's ids
/// (hex, or a client's own) are never ended that way unless a client picks this prefix.
pub const ENVOY_LEASES: &str = "envoy.";

/// Envoy's door: takes `count` slots of `key` under `limit` for the namespace's
/// `lease_ttl`, under a new lease of [`ENVOY_LEASES`].
pub async fn acquire_for_envoy(
    ns: &Namespace,
    c: &Concurrency,
    key: &str,
    count: u32,
    limit: u64,
) -> Result<AcquireAnswer, Error> {
    let lease = format!("{ENVOY_LEASES}{}", new_lease_id());
    take(ns, key, lease, false, count, limit, c.lease_ttl).await
}

/// Envoy's door: ends up to `count` slots of `key`'s leases taken by that door, the
/// earliest to lapse first; answers the slots ended (none when they lapsed).
pub async fn release_for_envoy(ns: &Namespace, key: &str, count: u32) -> Result<u32, Error> {
    let now = now();
    match ns
        .sync
        .release_lease_slots(key, ENVOY_LEASES, count, now)
        .await
    {
        Some(r) => r.map_err(|e| Error::store(&e, "releasing leases")),
        None => Ok(ns.leases.release_slots(key, ENVOY_LEASES, count, now)),
    }
}

/// Ends a lease a door took for a request it then refused (all or nothing), at once,
/// or by a task retrying until the store answers.
pub async fn give_up(ns: &Namespace, key: &str, a: &AcquireAnswer) {
    match ns.sync.end_or_renew_lease(key, &a.lease, now(), None).await {
        Some(Err(_)) => {
            tokio::spawn(abandon(
                ns.sync.clone(),
                key.to_owned(),
                a.lease.clone(),
                a.expires_at,
            ));
        }
        Some(Ok(_)) => {}
        None => {
            ns.leases.end_or_renew(key, &a.lease, now(), None);
        }
    }
}

/// Takes `count` slots of `key` under `lease` if its live leases leave room under
/// `limit`. A lease the node made (`own_id` false) that the store may have granted
/// though the call failed is ended by the node.
async fn take(
    ns: &Namespace,
    key: &str,
    lease: String,
    own_id: bool,
    count: u32,
    limit: u64,
    ttl: Duration,
) -> Result<AcquireAnswer, Error> {
    let now = now();
    let expires_at = UnixMs(now.0.saturating_add(ttl.as_millis() as i64));
    let a = Acquire {
        key,
        lease: &lease,
        count,
        limit,
        expires_at,
        now,
    };
    let acquired = match ns.sync.acquire_lease(a).await {
        Some(Ok(acquired)) => acquired,
        Some(Err(e)) => {
            if !own_id {
                // the store may have granted it before the call failed (a timeout): no
                // client knows the id, so the node ends it, not its lapse
                tokio::spawn(abandon(
                    ns.sync.clone(),
                    key.to_owned(),
                    lease.clone(),
                    expires_at,
                ));
            }
            return Err(Error::store(&e, "acquiring a lease"));
        }
        None => ns.leases.acquire(&a)?,
    };
    Ok(AcquireAnswer {
        acquired,
        lease,
        limit,
        expires_at,
        now,
    })
}

/// Ends a lease an acquire may have taken though it answered an error, retrying until
/// the store answers or the lease would have lapsed anyway. (A client's own id is left
/// alone: the client retries with it, and the retry replaces it.)
pub(crate) async fn abandon(
    sync: std::sync::Arc<swin_sync::NamespaceSync>,
    key: String,
    lease: String,
    expires_at: UnixMs,
) {
    while now() < expires_at {
        match sync.end_or_renew_lease(&key, &lease, now(), None).await {
            Some(Err(_)) => tokio::time::sleep(Duration::from_millis(500)).await,
            _ => return,
        }
    }
}

/// Ends a live lease of `key`: its slots are free at once. 404 `unknown_lease` when it
/// is unknown, released or lapsed (nothing changes).
pub async fn release(ns: &Namespace, name: &str, key: &str, lease: &str) -> Result<(), Error> {
    end_or_renew(ns, name, key, lease, None).await.map(|_| ())
}

/// Moves a live lease's lapse to `ttl` from now; answers the new lapse time.
pub async fn renew(
    ns: &Namespace,
    name: &str,
    key: &str,
    lease: &str,
    ttl: Option<f64>,
) -> Result<UnixMs, Error> {
    let c = concurrency_of(ns, name)?;
    let ttl = lease_ttl(ttl, &c)?;
    end_or_renew(ns, name, key, lease, Some(ttl)).await
}

async fn end_or_renew(
    ns: &Namespace,
    name: &str,
    key: &str,
    lease: &str,
    ttl: Option<Duration>,
) -> Result<UnixMs, Error> {
    concurrency_of(ns, name)?;
    crate::policy::input::check_key(key)?;
    check_lease_id(lease)?;
    let now = now();
    let to = ttl.map(|t| UnixMs(now.0.saturating_add(t.as_millis() as i64)));
    let what = if to.is_some() {
        "renewing a lease"
    } else {
        "releasing a lease"
    };
    let done = match ns.sync.end_or_renew_lease(key, lease, now, to).await {
        Some(r) => r.map_err(|e| Error::store(&e, what))?,
        None => ns.leases.end_or_renew(key, lease, now, to),
    };
    if !done {
        return Err(Error::UnknownLease(format!(
            "lease {lease:?} of key {key:?} is not live (released, lapsed or never granted); nothing was changed"
        )));
    }
    Ok(to.unwrap_or(now))
}

/// One lease held on this node (local-only namespaces).
#[derive(Debug, Clone)]
struct LocalLease {
    id: String,
    count: u32,
    expires_at: UnixMs,
}

const SHARDS: usize = 16;

/// A local-only namespace's leases: per key its live leases, under one lock per shard
/// of keys (an acquire counts and adds in one step). Lapsed leases are dropped when
/// their key is next touched, and every 1,024 calls a sweep drops keys with none live,
/// so memory follows the leases in flight.
#[derive(Debug)]
pub struct LocalLeases {
    shards: [Mutex<HashMap<String, Vec<LocalLease>>>; SHARDS],
    calls: AtomicU64,
    /// Keys with live leases at most (the namespace's `max_counters`).
    max_keys: usize,
}

impl LocalLeases {
    pub fn new(max_keys: usize) -> Self {
        LocalLeases {
            shards: std::array::from_fn(|_| Mutex::default()),
            calls: AtomicU64::new(0),
            max_keys,
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Vec<LocalLease>>> {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .hash_one(key);
        self.shards[(h as usize) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn maybe_sweep(&self, now: UnixMs) {
        if self.calls.fetch_add(1, Ordering::Relaxed) % 1024 != 1023 {
            return;
        }
        for shard in &self.shards {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            map.retain(|_, leases| {
                leases.retain(|l| l.expires_at > now);
                !leases.is_empty()
            });
        }
    }

    /// Slots of the live leases of every key.
    pub fn in_flight(&self, now: UnixMs) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                let map = s.lock().unwrap_or_else(|e| e.into_inner());
                map.values()
                    .flatten()
                    .filter(|l| l.expires_at > now)
                    .map(|l| u64::from(l.count))
                    .sum::<u64>()
            })
            .sum()
    }

    /// Keys with live leases (for the capacity bound and tests).
    pub fn keys(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// See [`swin_sync::store::Leases::acquire`]; refuses a new key past `max_keys`.
    pub fn acquire(&self, a: &Acquire<'_>) -> Result<Acquired, Error> {
        let max_keys = self.max_keys;
        self.maybe_sweep(a.now);
        let mut map = self.shard(a.key);
        if !map.contains_key(a.key) && map.len() >= max_keys.div_ceil(SHARDS) {
            // lapsed keys of this shard make room first
            map.retain(|_, leases| {
                leases.retain(|l| l.expires_at > a.now);
                !leases.is_empty()
            });
            if map.len() >= max_keys.div_ceil(SHARDS) {
                return Err(Error::Unavailable(format!(
                    "the node holds leases of {max_keys} keys (max_counters); try again later"
                )));
            }
        }
        let leases = map.entry(a.key.to_owned()).or_default();
        // lapsed leases and this lease's earlier self (a retried acquire) go
        leases.retain(|l| l.expires_at > a.now && l.id != a.lease);
        let in_flight: u64 = leases.iter().map(|l| u64::from(l.count)).sum();
        let earliest = leases.iter().map(|l| l.expires_at).min();
        let granted = in_flight + u64::from(a.count) <= a.limit;
        if granted {
            leases.push(LocalLease {
                id: a.lease.to_owned(),
                count: a.count,
                expires_at: a.expires_at,
            });
        } else if leases.is_empty() {
            map.remove(a.key);
        }
        Ok(swin_sync::store::leases::acquired(
            in_flight,
            earliest.map(|e| e.0),
            granted,
            a,
        ))
    }

    /// Ends (`renew_to: None`) or renews a live lease; false when it is not live.
    pub fn end_or_renew(
        &self,
        key: &str,
        lease: &str,
        now: UnixMs,
        renew_to: Option<UnixMs>,
    ) -> bool {
        self.maybe_sweep(now);
        let mut map = self.shard(key);
        let Some(leases) = map.get_mut(key) else {
            return false;
        };
        leases.retain(|l| l.expires_at > now);
        let found = leases.iter().position(|l| l.id == lease);
        match (found, renew_to) {
            (Some(i), None) => {
                leases.swap_remove(i);
            }
            (Some(i), Some(to)) => leases[i].expires_at = to,
            (None, _) => {}
        }
        if leases.is_empty() {
            map.remove(key);
        }
        found.is_some()
    }
}

impl LocalLeases {
    /// See [`swin_sync::store::Leases::release_slots`].
    pub fn release_slots(&self, key: &str, prefix: &str, count: u32, now: UnixMs) -> u32 {
        self.maybe_sweep(now);
        let mut map = self.shard(key);
        let Some(leases) = map.get_mut(key) else {
            return 0;
        };
        leases.retain(|l| l.expires_at > now);
        let mut live: Vec<(String, u32, UnixMs)> = leases
            .iter()
            .filter(|l| l.id.starts_with(prefix))
            .map(|l| (l.id.clone(), l.count, l.expires_at))
            .collect();
        live.sort_by(|a, b| (a.2, &a.0).cmp(&(b.2, &b.0)));
        let live: Vec<(String, u32)> = live.into_iter().map(|(id, c, _)| (id, c)).collect();
        let (whole, part) = swin_sync::store::leases::slots_to_end(&live, count);
        leases.retain(|l| !whole.contains(&l.id.as_str()));
        if let Some((id, keep)) = part {
            if let Some(l) = leases.iter_mut().find(|l| l.id == id) {
                l.count = keep;
            }
        }
        if leases.is_empty() {
            map.remove(key);
        }
        let live_slots: u64 = live.iter().map(|(_, c)| u64::from(*c)).sum();
        u32::try_from(live_slots.min(u64::from(count))).unwrap_or(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_released_by_prefix_go_earliest_first_and_spare_other_leases() {
        let l = LocalLeases::new(100);
        let at = |lease, count, lapse| Acquire {
            key: "k",
            lease,
            count,
            limit: 10,
            expires_at: UnixMs(lapse),
            now: UnixMs(0),
        };
        for (lease, count, lapse) in [
            ("envoy.b", 3, 2_000),
            ("envoy.a", 2, 1_000),
            ("mine", 1, 500),
        ] {
            assert!(l.acquire(&at(lease, count, lapse)).unwrap().granted);
        }
        assert_eq!(l.release_slots("k", "envoy.", 3, UnixMs(10)), 3);
        assert!(
            !l.end_or_renew("k", "envoy.a", UnixMs(10), None),
            "ended whole"
        );
        let probe = l
            .acquire(&Acquire {
                now: UnixMs(10),
                ..at("p", 8, 3_000)
            })
            .unwrap();
        assert_eq!((probe.granted, probe.in_flight), (false, 3));
        assert_eq!(l.release_slots("k", "envoy.", 5, UnixMs(10)), 2);
        assert_eq!(l.release_slots("k", "envoy.", 1, UnixMs(10)), 0);
        assert!(l.end_or_renew("k", "mine", UnixMs(10), None));
        assert_eq!(l.release_slots("none", "envoy.", 1, UnixMs(10)), 0);
    }

    fn acquire<'a>(key: &'a str, lease: &'a str, count: u32, now: i64) -> Acquire<'a> {
        Acquire {
            key,
            lease,
            count,
            limit: 3,
            expires_at: UnixMs(now + 1_000),
            now: UnixMs(now),
        }
    }

    #[test]
    fn never_past_the_limit_and_freed_by_release_or_lapse() {
        let l = LocalLeases::new(100);
        assert!(l.acquire(&acquire("k", "a", 2, 0)).unwrap().granted);
        let b = l.acquire(&acquire("k", "b", 2, 10)).unwrap();
        assert_eq!((b.granted, b.in_flight), (false, 2));
        assert_eq!(b.earliest_lapse, Some(UnixMs(1_000)));
        assert!(l.acquire(&acquire("other", "b", 3, 10)).unwrap().granted);
        // a retried acquire replaces itself
        let again = l.acquire(&acquire("k", "a", 2, 20)).unwrap();
        assert_eq!((again.granted, again.in_flight), (true, 2));
        assert!(l.end_or_renew("k", "a", UnixMs(30), None));
        assert!(!l.end_or_renew("k", "a", UnixMs(30), None), "once");
        assert!(l.acquire(&acquire("k", "c", 3, 40)).unwrap().granted);
        // lapsed at 1,040: the slots are free, the lease cannot be renewed
        assert!(!l.end_or_renew("k", "c", UnixMs(1_040), Some(UnixMs(5_000))));
        assert!(l.acquire(&acquire("k", "d", 3, 1_040)).unwrap().granted);
        assert!(l.end_or_renew("k", "d", UnixMs(1_050), Some(UnixMs(9_000))));
        assert!(!l.acquire(&acquire("k", "e", 1, 5_000)).unwrap().granted);
    }

    #[test]
    fn keys_are_bounded() {
        let l = LocalLeases::new(32);
        let mut refused = 0;
        for i in 0..200 {
            let key = format!("k{i}");
            match l.acquire(&acquire(&key, "a", 1, 0)) {
                Ok(a) => assert!(a.granted),
                Err(Error::Unavailable(_)) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            refused > 0 && l.keys() <= 32 + SHARDS,
            "{refused} {}",
            l.keys()
        );
        // once they lapse, new keys fit again
        assert!(l.acquire(&acquire("late", "a", 1, 5_000)).unwrap().granted);
    }
}
