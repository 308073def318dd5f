//! A local-only namespace's leases, kept on this node, under the stores' acquire,
//! release and lapse rules. No reply is lost between a node and its own table, so a
//! release keeps no mark of its end (a lease released is not live, as any other).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use swin_core::UnixMs;

use super::MemoryStore;
use crate::store::{Acquire, Acquired, LeaseStore, Released};
use crate::StoreError;

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
pub(super) struct Leases {
    shards: [Mutex<HashMap<String, Vec<LocalLease>>>; SHARDS],
    calls: AtomicU64,
    /// Keys with live leases at most (the namespace's `max_counters`).
    max_keys: usize,
}

impl Leases {
    /// A table for leases of at most `max_keys` keys.
    pub(super) fn new(max_keys: usize) -> Self {
        Leases {
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
    fn slots_in_flight(&self, now: UnixMs) -> u64 {
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

    /// See [`LeaseStore::acquire`]; refuses a new key past `max_keys`.
    fn take(&self, a: &Acquire<'_>) -> Result<Acquired, StoreError> {
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
                return Err(StoreError::Full(format!(
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
        Ok(crate::store::leases::acquired(
            in_flight,
            earliest.map(|e| e.0),
            granted,
            a,
        ))
    }

    /// Ends (`renew_to: None`) or renews a live lease; false when it is not live.
    fn end_or_renew(&self, key: &str, lease: &str, now: UnixMs, renew_to: Option<UnixMs>) -> bool {
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

impl Leases {
    /// See [`LeaseStore::release_slots`].
    fn end_slots(&self, key: &str, prefix: &str, count: u32, now: UnixMs) -> u32 {
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
        let (whole, part) = crate::store::leases::slots_to_end(&live, count);
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

impl LeaseStore for MemoryStore {
    async fn acquire(
        &self,
        _namespace: &str,
        a: Acquire<'_>,
        _not_after: UnixMs,
    ) -> Result<Acquired, StoreError> {
        self.leases.take(&a)
    }

    async fn release(
        &self,
        _namespace: &str,
        key: &str,
        lease: &str,
        _op: &str,
        now: UnixMs,
        _not_after: UnixMs,
    ) -> Result<Released, StoreError> {
        Ok(match self.leases.end_or_renew(key, lease, now, None) {
            true => Released::Now,
            false => Released::NotLive,
        })
    }

    async fn release_slots(
        &self,
        _namespace: &str,
        key: &str,
        prefix: &str,
        count: u32,
        now: UnixMs,
        _not_after: UnixMs,
    ) -> Result<u32, StoreError> {
        Ok(self.leases.end_slots(key, prefix, count, now))
    }

    async fn in_flight(&self, _namespace: &str, now: UnixMs) -> Result<u64, StoreError> {
        Ok(self.leases.slots_in_flight(now))
    }

    async fn renew(
        &self,
        _namespace: &str,
        key: &str,
        lease: &str,
        expires_at: UnixMs,
        now: UnixMs,
        _not_after: UnixMs,
    ) -> Result<bool, StoreError> {
        Ok(self.leases.end_or_renew(key, lease, now, Some(expires_at)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_released_by_prefix_go_earliest_first_and_spare_other_leases() {
        let l = Leases::new(100);
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
            assert!(l.take(&at(lease, count, lapse)).unwrap().granted);
        }
        assert_eq!(l.end_slots("k", "envoy.", 3, UnixMs(10)), 3);
        assert!(
            !l.end_or_renew("k", "envoy.a", UnixMs(10), None),
            "ended whole"
        );
        let probe = l
            .take(&Acquire {
                now: UnixMs(10),
                ..at("p", 8, 3_000)
            })
            .unwrap();
        assert_eq!((probe.granted, probe.in_flight), (false, 3));
        assert_eq!(l.end_slots("k", "envoy.", 5, UnixMs(10)), 2);
        assert_eq!(l.end_slots("k", "envoy.", 1, UnixMs(10)), 0);
        assert!(l.end_or_renew("k", "mine", UnixMs(10), None));
        assert_eq!(l.end_slots("none", "envoy.", 1, UnixMs(10)), 0);
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
        let l = Leases::new(100);
        assert!(l.take(&acquire("k", "a", 2, 0)).unwrap().granted);
        let b = l.take(&acquire("k", "b", 2, 10)).unwrap();
        assert_eq!((b.granted, b.in_flight), (false, 2));
        assert_eq!(b.earliest_lapse, Some(UnixMs(1_000)));
        assert!(l.take(&acquire("other", "b", 3, 10)).unwrap().granted);
        // a retried acquire replaces itself
        let again = l.take(&acquire("k", "a", 2, 20)).unwrap();
        assert_eq!((again.granted, again.in_flight), (true, 2));
        assert!(l.end_or_renew("k", "a", UnixMs(30), None));
        assert!(!l.end_or_renew("k", "a", UnixMs(30), None), "once");
        assert!(l.take(&acquire("k", "c", 3, 40)).unwrap().granted);
        // lapsed at 1,040: the slots are free, the lease cannot be renewed
        assert!(!l.end_or_renew("k", "c", UnixMs(1_040), Some(UnixMs(5_000))));
        assert!(l.take(&acquire("k", "d", 3, 1_040)).unwrap().granted);
        assert!(l.end_or_renew("k", "d", UnixMs(1_050), Some(UnixMs(9_000))));
        assert!(!l.take(&acquire("k", "e", 1, 5_000)).unwrap().granted);
    }

    #[test]
    fn keys_are_bounded() {
        let l = Leases::new(32);
        let mut refused = 0;
        for i in 0..200 {
            let key = format!("k{i}");
            match l.take(&acquire(&key, "a", 1, 0)) {
                Ok(a) => assert!(a.granted),
                Err(StoreError::Full(_)) => refused += 1,
                Err(e) => panic!("{e}"),
            }
        }
        assert!(
            refused > 0 && l.keys() <= 32 + SHARDS,
            "{refused} {}",
            l.keys()
        );
        // once they lapse, new keys fit again
        assert!(l.take(&acquire("late", "a", 1, 5_000)).unwrap().granted);
    }
}
