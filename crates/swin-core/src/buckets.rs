//! GCRA buckets a node holds in local memory: per key, the theoretical arrival time
//! (TAT, Unix nanoseconds) and the advances made here that no store has seen yet.
//!
//! A spend moves the TAT forward from `max(tat, now)` by `cost · emission interval`; that
//! move is the bucket's diff. A sync drains the advances, the store applies them as
//! `tat = max(tat, now) + Σ advances` and returns the cluster's TAT, and the node takes
//! `max(its TAT, cluster TAT + advances made since the drain)`: its own hits are never
//! forgotten and other nodes' hits arrive within a sync period.
//!
//! Lock-free: the TAT is one atomic, changed by compare-and-swap, so two threads racing
//! for the last token can never both get it. A bucket that is full again (TAT at or
//! before `now`) with nothing pending is the same as no bucket and is dropped at the next
//! drain; a spend that races with the drop retries on a fresh bucket.
//!
//! (Over 500 lines only because its unit tests sit at the end, beside the code they
//! test; the table itself is under 400.)

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use compact_str::CompactString;

use crate::{CoreError, Decision, Gcra, GcraOutcome, Retention};

/// A TAT advance drained from a bucket: what this node's spends (and refunds) moved it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advance {
    pub key: CompactString,
    /// Nanoseconds; negative after refunds.
    pub ns: i64,
}

/// A bucket's TAT as a store holds it (Unix nanoseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tat {
    pub key: CompactString,
    pub tat_ns: i64,
}

/// TAT of a bucket that was dropped; whoever sees it looks the key up again.
const DEAD: i64 = i64::MIN;
/// TAT of a bucket never spent from (Boulder's "no TAT stored").
const NEVER: i64 = 0;

#[derive(Debug, Default)]
struct Bucket {
    tat: AtomicI64,
    pending: AtomicI64,
}

type Hasher = foldhash::fast::RandomState;

/// The GCRA buckets of one namespace. The limit (burst, count, period) is an argument of
/// every call, so per-key overrides and reloads need nothing from the table.
#[derive(Debug)]
pub struct BucketTable {
    namespace: CompactString,
    max: usize,
    /// Local-only: the table is the only record of a key's spends, and only a full
    /// bucket may be evicted (a new bucket is full: nothing is lost).
    retention: Retention,
    map: papaya::HashMap<CompactString, Arc<Bucket>, Hasher>,
    /// Drains so far: a drain is what makes buckets with pending advances evictable.
    drains: AtomicU64,
    /// `drains` when an eviction last found nothing to evict (`u64::MAX`: never): until
    /// the next drain a new key is refused without scanning again.
    full_at: AtomicU64,
    evict_lock: Mutex<()>,
}

impl BucketTable {
    pub fn new(namespace: &str, max_buckets: usize, retention: Retention) -> Self {
        BucketTable {
            namespace: namespace.into(),
            max: max_buckets.max(1),
            retention,
            map: papaya::HashMap::builder()
                .hasher(Hasher::default())
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            drains: AtomicU64::new(0),
            full_at: AtomicU64::new(u64::MAX),
            evict_lock: Mutex::new(()),
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    fn bucket(&self, key: &str, now_ns: i64) -> Result<Arc<Bucket>, CoreError> {
        let map = self.map.pin();
        if let Some(b) = map.get(key) {
            return Ok(b.clone());
        }
        if map.len() >= self.max {
            self.make_room(now_ns);
            if self.map.len() >= self.max {
                return Err(CoreError::BucketsFull {
                    namespace: self.namespace.to_string(),
                    max: self.max,
                });
            }
        }
        Ok(map
            .get_or_insert_with(key.into(), || Arc::new(Bucket::default()))
            .clone())
    }

    /// Drops `b` from the map if it is still the key's bucket.
    fn forget(&self, key: &str, b: &Arc<Bucket>) {
        let map = self.map.pin();
        let _ = map.remove_if(key, |_, v| Arc::ptr_eq(v, b));
    }

    /// Whether a bucket is held for the key (full or not).
    pub fn contains(&self, key: &str) -> bool {
        self.map.pin().contains_key(key)
    }

    /// The key's TAT (`None`: full, nothing known).
    pub fn tat(&self, key: &str) -> Option<i64> {
        let map = self.map.pin();
        let t = map.get(key)?.tat.load(SeqCst);
        (t != NEVER && t != DEAD).then_some(t)
    }

    /// Spends `cost` if the limit allows it; with `force` a denied spend moves the TAT
    /// anyway (the namespace counts denied hits). Only an allowed or forced spend changes
    /// anything.
    pub fn spend(
        &self,
        gcra: &Gcra,
        key: &str,
        now_ns: i64,
        cost: i64,
        force: bool,
    ) -> Result<Decision, CoreError> {
        self.update(key, now_ns, |tat| {
            let d = gcra.spend(tat, now_ns, cost)?;
            if d.decision.allowed || !force {
                return Ok((d, d.decision.allowed));
            }
            let forced = tat
                .unwrap_or(now_ns)
                .max(now_ns)
                .saturating_add(gcra.emission_ns().saturating_mul(cost));
            Ok((
                GcraOutcome {
                    new_tat: forced,
                    ..d
                },
                true,
            ))
        })
    }

    /// Gives `cost` back (Boulder's refund); nothing changes when the bucket is full.
    pub fn refund(
        &self,
        gcra: &Gcra,
        key: &str,
        now_ns: i64,
        cost: i64,
    ) -> Result<Decision, CoreError> {
        self.update(key, now_ns, |tat| {
            let d = gcra.refund(tat, now_ns, cost)?;
            Ok((d, d.decision.allowed))
        })
    }

    /// What a spend would answer, changing nothing.
    pub fn dry_run(
        &self,
        gcra: &Gcra,
        key: &str,
        now_ns: i64,
        cost: i64,
    ) -> Result<Decision, CoreError> {
        Ok(gcra.dry_run(self.tat(key), now_ns, cost)?.decision)
    }

    /// Decides with `f` on the key's TAT and, when `f` says so, moves the TAT to the
    /// decision's `new_tat` by compare-and-swap, recording the move as pending.
    fn update(
        &self,
        key: &str,
        now_ns: i64,
        f: impl Fn(Option<i64>) -> Result<(GcraOutcome, bool), CoreError>,
    ) -> Result<Decision, CoreError> {
        loop {
            let b = self.bucket(key, now_ns)?;
            let old = b.tat.load(SeqCst);
            if old == DEAD {
                self.forget(key, &b);
                continue;
            }
            let (d, store) = f((old != NEVER).then_some(old))?;
            if !store || d.new_tat == old {
                return Ok(d.decision);
            }
            let advance = d.new_tat - old.max(now_ns);
            // pending first: a drop looks at pending before it marks the bucket dead
            b.pending.fetch_add(advance, SeqCst);
            if b.tat
                .compare_exchange(old, d.new_tat, SeqCst, SeqCst)
                .is_ok()
            {
                return Ok(d.decision);
            }
            b.pending.fetch_sub(advance, SeqCst);
        }
    }

    /// Marks a full, idle bucket dead and drops it. False when it is in use.
    fn try_drop(&self, key: &str, b: &Arc<Bucket>, now_ns: i64) -> bool {
        self.evict(key, b, Some(now_ns))
    }

    /// Makes room for a new bucket: evicts the buckets that refill soonest (the least
    /// state lost: full ones first, then the ones closest to full) among those with no
    /// advance waiting to be pushed, down to 90 % of the cap, so the scan is paid once
    /// per tenth of the cap of new keys. An evicted bucket that was not full is
    /// forgotten here: that key starts full again on this node until a sync reads its
    /// TAT back (the alternative, evicting only full buckets, let a flood of keys
    /// spending their whole burst lock every new key out until they refilled). In a
    /// local-only namespace nothing would read it back — a key at its limit that churned
    /// other keys would spend its burst again — so only full buckets are evicted there,
    /// and a new key waits while none is. When nothing can be evicted that is remembered
    /// until the next drain, so refusing a new key costs no scan.
    fn make_room(&self, now_ns: i64) {
        let drains = self.drains.load(SeqCst);
        if self.full_at.load(SeqCst) == drains {
            return;
        }
        let _guard = self.evict_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.map.len() < self.max || self.full_at.load(SeqCst) == drains {
            return;
        }
        let map = self.map.pin();
        let mut candidates: Vec<(i64, CompactString, Arc<Bucket>)> = map
            .iter()
            .filter(|(_, b)| {
                b.pending.load(SeqCst) == 0
                    && (self.retention == Retention::Synced || b.tat.load(SeqCst) <= now_ns)
            })
            .map(|(k, b)| (b.tat.load(SeqCst), k.clone(), b.clone()))
            .collect();
        drop(map);
        let target = self.max - self.max / 10;
        let excess = self.map.len().saturating_sub(target.max(1) - 1);
        let n = excess.min(candidates.len());
        if n > 0 && n < candidates.len() {
            candidates.select_nth_unstable_by_key(n - 1, |(t, _, _)| *t);
        }
        let mut evicted = 0;
        for (_, k, b) in candidates.into_iter().take(n) {
            let full_by = (self.retention == Retention::LocalOnly).then_some(now_ns);
            if self.evict(&k, &b, full_by) {
                evicted += 1;
            }
        }
        if evicted == 0 {
            self.full_at.store(drains, SeqCst);
        }
    }

    /// Drops `b` if it has nothing to push and, with `full_by`, is full by then (a spend
    /// that races with this retries on a fresh bucket, as with `try_drop`).
    fn evict(&self, key: &str, b: &Arc<Bucket>, full_by: Option<i64>) -> bool {
        let t = b.tat.load(SeqCst);
        if t == DEAD {
            self.forget(key, b);
            return true;
        }
        // the TAT checked is the one the compare-and-swap below replaces
        if full_by.is_some_and(|now_ns| t > now_ns) || b.pending.load(SeqCst) != 0 {
            return false;
        }
        if b.tat.compare_exchange(t, DEAD, SeqCst, SeqCst).is_ok() {
            self.forget(key, b);
            return true;
        }
        false
    }

    /// Takes every pending advance (a spend racing with it lands in this batch or the
    /// next) and drops buckets that are full and idle.
    pub fn drain(&self, now_ns: i64) -> Vec<Advance> {
        self.drains.fetch_add(1, SeqCst);
        let map = self.map.pin();
        let mut out = Vec::new();
        let mut idle = Vec::new();
        for (k, b) in map.iter() {
            let ns = b.pending.swap(0, SeqCst);
            if ns != 0 {
                out.push(Advance { key: k.clone(), ns });
            } else if b.tat.load(SeqCst) <= now_ns {
                idle.push((k.clone(), b.clone()));
            }
        }
        drop(map);
        for (k, b) in idle {
            self.try_drop(&k, &b, now_ns);
        }
        out
    }

    /// Puts drained advances back after a failed push.
    pub fn restore(&self, advances: &[Advance]) {
        for a in advances {
            loop {
                let map = self.map.pin();
                let b = map
                    .get_or_insert_with(a.key.clone(), || Arc::new(Bucket::default()))
                    .clone();
                drop(map);
                if b.tat.load(SeqCst) == DEAD {
                    self.forget(&a.key, &b);
                    continue;
                }
                b.pending.fetch_add(a.ns, SeqCst);
                if b.tat.load(SeqCst) != DEAD {
                    break;
                }
                // dropped between the two loads: take it back out and retry
                b.pending.fetch_sub(a.ns, SeqCst);
            }
        }
    }

    /// Takes the cluster's TATs: each bucket keeps the later of its own TAT and the
    /// store's plus what it spent since the drain. `create` adds buckets for keys it does
    /// not hold (warm-up, synchronous spends).
    pub fn apply(&self, tats: &[Tat], create: bool) {
        for t in tats {
            let map = self.map.pin();
            let b = if create {
                map.get_or_insert_with(t.key.clone(), || Arc::new(Bucket::default()))
                    .clone()
            } else {
                match map.get(&t.key) {
                    Some(b) => b.clone(),
                    None => continue,
                }
            };
            drop(map);
            loop {
                let old = b.tat.load(SeqCst);
                if old == DEAD {
                    break;
                }
                let want = t.tat_ns.saturating_add(b.pending.load(SeqCst));
                if want <= old {
                    break;
                }
                if b.tat.compare_exchange(old, want, SeqCst, SeqCst).is_ok() {
                    break;
                }
            }
        }
    }

    /// Drops the key's bucket if nothing is pending: the store no longer holds it (a
    /// reset elsewhere in the cluster, or full and purged).
    pub fn forget_if_idle(&self, key: &str) {
        let map = self.map.pin();
        let Some(b) = map.get(key).cloned() else {
            return;
        };
        drop(map);
        let t = b.tat.load(SeqCst);
        if t != DEAD
            && b.pending.load(SeqCst) == 0
            && b.tat.compare_exchange(t, DEAD, SeqCst, SeqCst).is_ok()
        {
            self.forget(key, &b);
        }
    }

    /// Keys held, to refresh from the store.
    pub fn keys(&self) -> Vec<CompactString> {
        self.map.pin().keys().cloned().collect()
    }

    /// Forgets the key's bucket and anything it had pending (a reset).
    pub fn reset(&self, key: &str) {
        let map = self.map.pin();
        if let Some(b) = map.get(key) {
            b.pending.store(0, SeqCst);
            b.tat.store(DEAD, SeqCst);
        }
        map.remove(key);
    }
}

#[cfg(test)]
mod tests;
