//! The heaviest keys of the last minute in fixed memory: Space-Saving summaries
//! (Metwally, Agrawal and El Abbadi, "Efficient Computation of Frequent and Top-k
//! Elements in Data Streams", 2005) in six slots of ten seconds, sharded by key.
//!
//! A summary of `c` counters over a stream of total weight `N` keeps every key whose
//! weight is above `N / c`, and over-counts any key by at most `N / c`; each counter
//! carries its own over-count bound (`error`: the count of the key it replaced). Keys
//! are sharded (a key always lands in the same shard), so the shards' summaries cover
//! disjoint keys and a key's bound is its shard's `N_shard / c`. A minute is six slots:
//! a key's count over the minute is the sum of its slots and so is its bound. Memory is
//! fixed: `SHARDS × SLOTS × CAPACITY` counters per summary, whatever the number of keys.
//! Summaries of several nodes merge by adding counts and bounds.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Mutex;

use crate::CompactString;

/// Shards: a hit locks one of them.
pub const SHARDS: usize = 16;

/// Counters per shard and slot.
pub const CAPACITY: usize = 64;

/// Slots, of [`SLOT_SECS`] each: the last minute.
pub const SLOTS: usize = 6;

pub const SLOT_SECS: i64 = 10;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Counter {
    count: f64,
    /// How much `count` may exceed the key's weight.
    error: f64,
}

/// One Space-Saving summary.
#[derive(Debug, Default)]
struct Summary {
    counters: HashMap<CompactString, Counter, foldhash::fast::FixedState>,
    total: f64,
    /// At most the smallest count held (counts only grow, so a smallest count once seen
    /// stays a lower bound): an eviction takes the first counter at it without looking
    /// at the rest, and looks at all of them only when none is left there.
    floor: f64,
}

impl Summary {
    fn add(&mut self, key: &str, weight: f64) {
        self.total += weight;
        if let Some(c) = self.counters.get_mut(key) {
            c.count += weight;
            return;
        }
        if self.counters.len() < CAPACITY {
            self.counters.insert(
                key.into(),
                Counter {
                    count: weight,
                    error: 0.0,
                },
            );
            return;
        }
        // the smallest counter goes to the new key, which inherits its count as error
        let at_floor = self
            .counters
            .iter()
            .find(|(_, c)| c.count <= self.floor)
            .map(|(k, c)| (k.clone(), *c));
        let Some((min_key, min)) = at_floor.or_else(|| {
            self.counters
                .iter()
                .min_by(|a, b| a.1.count.total_cmp(&b.1.count))
                .map(|(k, c)| (k.clone(), *c))
        }) else {
            return;
        };
        self.floor = min.count;
        self.counters.remove(&min_key);
        self.counters.insert(
            key.into(),
            Counter {
                count: min.count + weight,
                error: min.count,
            },
        );
    }

    /// The largest over-count of a key this summary does not hold (its smallest count,
    /// 0 while it has room).
    fn floor(&self) -> f64 {
        if self.counters.len() < CAPACITY {
            return 0.0;
        }
        self.counters
            .values()
            .map(|c| c.count)
            .fold(f64::INFINITY, f64::min)
    }
}

#[derive(Debug, Default)]
struct Shard {
    /// Per slot: the 10-second period it holds and its summary.
    slots: [(i64, Summary); SLOTS],
}

/// One key of an answer: its weight over the minute is within `error` of `count` (the
/// slots that held it over-count by at most their counters' errors; a slot that did not
/// hold it may have missed up to its smallest counter).
#[derive(Debug, Clone, PartialEq)]
pub struct Heavy {
    pub key: CompactString,
    pub count: f64,
    pub error: f64,
}

/// The heaviest keys of the last minute and what bounds the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct TopAnswer {
    pub keys: Vec<Heavy>,
    /// The weight counted over the minute.
    pub total: f64,
    /// A key left out weighs at most this over the minute (the sum over shards' and
    /// slots' smallest counters is per shard; the largest shard's is given).
    pub bound: f64,
}

/// The heaviest keys of the last minute of one stream (a namespace's hits, or its
/// denials).
#[derive(Debug)]
pub struct TopKeys {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::FixedState,
}

impl Default for TopKeys {
    fn default() -> Self {
        TopKeys {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::FixedState::with_seed(0x746f_706b),
        }
    }
}

fn period(now_secs: i64) -> i64 {
    now_secs.div_euclid(SLOT_SECS)
}

impl TopKeys {
    /// Adds `weight` to `key` at `now_secs` (Unix seconds).
    pub fn add(&self, key: &str, weight: f64, now_secs: i64) {
        if !(weight.is_finite() && weight > 0.0) {
            return;
        }
        let shard = &self.shards[(self.hasher.hash_one(key) as usize) % SHARDS];
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let p = period(now_secs);
        let slot = &mut shard.slots[p.rem_euclid(SLOTS as i64) as usize];
        if slot.0 != p {
            *slot = (p, Summary::default());
        }
        slot.1.add(key, weight);
    }

    /// The `count` heaviest keys of the minute before `now_secs`, heaviest first.
    pub fn top(&self, count: usize, now_secs: i64) -> TopAnswer {
        let p = period(now_secs);
        let mut keys: Vec<Heavy> = Vec::new();
        let (mut total, mut bound) = (0.0, 0.0f64);
        for shard in self.shards.iter() {
            let shard = shard.lock().unwrap_or_else(|e| e.into_inner());
            // per key: count, error where held, and the floors of the slots that held it
            let mut merged: HashMap<&str, (Counter, f64)> = HashMap::new();
            let mut floors = 0.0;
            for (slot_period, summary) in &shard.slots {
                if p - slot_period >= SLOTS as i64 || *slot_period > p {
                    continue;
                }
                total += summary.total;
                let floor = summary.floor();
                floors += floor;
                for (k, c) in &summary.counters {
                    let (m, held_floors) = merged.entry(k.as_str()).or_default();
                    m.count += c.count;
                    m.error += c.error;
                    *held_floors += floor;
                }
            }
            for (k, (c, held_floors)) in merged {
                keys.push(Heavy {
                    key: k.into(),
                    count: c.count,
                    // over-counted by the held slots' errors at most, or missed by the
                    // other slots' floors at most
                    error: c.error.max(floors - held_floors),
                });
            }
            bound = bound.max(floors);
        }
        keys.sort_by(|a, b| b.count.total_cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
        keys.truncate(count);
        TopAnswer { keys, total, bound }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heavy_keys_are_found_with_their_bounds() {
        let t = TopKeys::default();
        let now = 1_000_000;
        // 10,000 light keys once each, three heavy ones
        for i in 0..10_000 {
            t.add(&format!("light{i}"), 1.0, now);
        }
        for _ in 0..500 {
            t.add("a", 1.0, now);
        }
        for _ in 0..300 {
            t.add("b", 2.0, now);
        }
        for _ in 0..200 {
            t.add("c", 1.0, now);
        }
        let top = t.top(3, now);
        let names: Vec<&str> = top.keys.iter().map(|h| h.key.as_str()).collect();
        assert_eq!(names, ["b", "a", "c"]);
        for (h, weight) in top.keys.iter().zip([600.0, 500.0, 200.0]) {
            assert!((h.count - weight).abs() <= h.error, "{h:?}");
            assert!(h.error <= top.bound, "{h:?} {}", top.bound);
        }
        assert_eq!(top.total, 10_000.0 + 500.0 + 600.0 + 200.0);
        // the bound: a shard's weight over its counters
        assert!(top.bound <= top.total / CAPACITY as f64, "{}", top.bound);
    }

    #[test]
    fn only_the_last_minute_counts() {
        let t = TopKeys::default();
        t.add("old", 100.0, 1_000);
        t.add("new", 1.0, 1_055);
        let top = t.top(10, 1_055);
        assert_eq!(top.keys.len(), 2, "{top:?}");
        let top = t.top(10, 1_000 + 60);
        assert_eq!(
            top.keys.len(),
            1,
            "a minute later the old slot is out: {top:?}"
        );
        assert_eq!(top.keys[0].key.as_str(), "new");
        // a slot is reused for a later period: its old keys go
        t.add("later", 1.0, 1_000 + 60);
        let top = t.top(10, 1_060);
        assert!(top.keys.iter().all(|h| h.key.as_str() != "old"));
        assert_eq!(top.total, 2.0);
    }

    #[test]
    fn memory_is_fixed_whatever_the_keys() {
        let t = TopKeys::default();
        for i in 0..200_000 {
            t.add(&format!("k{i}"), 1.0, 5_000);
        }
        let held: usize = t
            .shards
            .iter()
            .map(|s| {
                s.lock()
                    .expect("shard")
                    .slots
                    .iter()
                    .map(|x| x.1.counters.len())
                    .sum::<usize>()
            })
            .sum();
        assert!(held <= SHARDS * CAPACITY, "{held}");
        // weights that are no weight are not counted
        t.add("nan", f64::NAN, 5_000);
        t.add("neg", -1.0, 5_000);
        assert_eq!(t.top(1, 5_000).total, 200_000.0);
    }
}
