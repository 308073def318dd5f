//! The counters of one namespace for one window size: a lock-free map from key to
//! [`Entry`], with a cap on entries held and an overflow list for diffs whose window
//! rolled out of an entry before it was drained.
//!
//! Why papaya and not dashmap: dashmap takes its shard's read lock on every lookup, an
//! atomic write to a line every thread shares, so a hot key hit from two threads
//! serialises on that line (the `counters` benchmark shows the dashmap baseline falling
//! on two threads). papaya's reads write nothing shared.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use compact_str::CompactString;

use crate::drain::DrainSlices;
use crate::entry::{Added, Entry, Retention, View};
use crate::{CoreError, Diff, Total, UnixMs, WindowRate, WindowSize, MAX_COUNT};

/// Sizing and retention of a counter table.
#[derive(Debug, Clone, Copy)]
pub struct CounterOptions {
    pub retention: Retention,
    /// Entries (key × window size) held before least recently used ones are evicted.
    pub max_counters: usize,
}

impl Default for CounterOptions {
    fn default() -> Self {
        CounterOptions {
            retention: Retention::Synced,
            max_counters: crate::DEFAULT_MAX_COUNTERS,
        }
    }
}

/// foldhash: a fast, seeded hasher (keys are attacker-chosen, so the seed matters).
type Hasher = foldhash::fast::RandomState;

#[derive(Debug)]
pub struct WindowTable {
    namespace: CompactString,
    size: WindowSize,
    options: CounterOptions,
    map: papaya::HashMap<CompactString, Entry, Hasher>,
    overflow: Mutex<Vec<Diff>>,
    evict_lock: Mutex<()>,
    evictions: AtomicU64,
    /// Drains (and slices of one) so far: a drain is what makes entries evictable.
    drains: AtomicU64,
    /// `drains` when an eviction last left the table full (`u64::MAX`: never): until
    /// the next drain a new key is refused without scanning again.
    full_at: AtomicU64,
}

impl WindowTable {
    pub fn new(namespace: &str, size: WindowSize, options: CounterOptions) -> Self {
        WindowTable {
            namespace: namespace.into(),
            size,
            options,
            map: papaya::HashMap::builder()
                .hasher(Hasher::default())
                .resize_mode(papaya::ResizeMode::Blocking)
                .build(),
            overflow: Mutex::new(Vec::new()),
            evict_lock: Mutex::new(()),
            evictions: AtomicU64::new(0),
            drains: AtomicU64::new(0),
            full_at: AtomicU64::new(u64::MAX),
        }
    }

    pub fn size(&self) -> WindowSize {
        self.size
    }

    /// Entries held (key × this window size).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Entries evicted to stay under the cap since the table was made.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    fn spill(&self, key: &str, start: i64, value: f64) {
        if self.options.retention == Retention::Synced {
            self.overflow
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Diff {
                    key: key.into(),
                    window_size: self.size.secs(),
                    window_start: start,
                    value,
                });
        }
    }

    /// Adds `value` to the key's current window and returns the sliding rate after it.
    pub fn increment(&self, key: &str, value: f64, now: UnixMs) -> Result<WindowRate, CoreError> {
        check_value(value)?;
        let size = self.size.secs();
        let start = self.size.start_of(now);
        let map = self.map.pin();
        let entry = match map.get(key) {
            Some(e) => e,
            None => {
                self.make_room(now)?;
                map.get_or_insert_with(key.into(), || Entry::new(now.secs()))
            }
        };
        entry.touch(now.secs());
        let mut spill = |s, v| self.spill(key, s, v);
        let Some(idx) = entry.prepare(start, size, &mut spill) else {
            // The caller's clock is windows behind this entry: keep the hit for the
            // store, and answer as if the window were new.
            self.spill(key, start, value);
            return Ok(WindowRate::at(self.size, now, value, 0.0));
        };
        let mut added = entry.add(idx, value);
        let view = View::Hot { now_ms: now.0 };
        if value < 0.0 {
            // A count never goes below zero, as in every store: a decrement takes only
            // what is there (else the node would answer −93 while the stores say 0, and
            // admit that many hits past a limit before its next sync).
            let (synced, diff) = entry.parts_of(start, size, view);
            let below = synced + diff;
            if below < 0.0 && entry.add(idx, -below.max(value)) == Added::Retired {
                added = Added::Retired;
            }
        }
        let rate = self.rate_of(entry, now, None, view);
        // The check costs nothing on the hot path: the rate is computed anyway. A hit
        // that would take the window out of range is taken back out (a racing drain
        // may push the two halves apart; they still sum to nothing).
        let out_of_range = rate.current.abs() >= MAX_COUNT;
        if out_of_range && entry.add(idx, -value) == Added::Retired {
            added = Added::Retired;
        }
        if added == Added::Retired {
            if self.options.retention == Retention::LocalOnly {
                if entry.is_retired() {
                    // an eviction took the entry as this hit landed (its windows had
                    // passed): nothing else holds the hit, so it is counted again in a
                    // new entry
                    self.remove_retired(&map, key, entry);
                    return self.increment(key, value, now);
                }
                // the eviction kept the entry: the hit is in it
            } else {
                entry.flush_retired(&mut spill);
            }
        }
        if out_of_range {
            return Err(CoreError::CountOutOfRange {
                value,
                max: MAX_COUNT,
            });
        }
        Ok(rate)
    }

    /// The sliding rate of a key without counting a hit. `current_diff` replaces this
    /// node's unsynced hits in the current window (Kong's `sliding_window(cur_diff)`).
    pub fn rate(&self, key: &str, now: UnixMs, current_diff: Option<f64>) -> WindowRate {
        let map = self.map.pin();
        match map.get(key) {
            Some(e) => {
                e.touch(now.secs());
                self.rate_of(e, now, current_diff, View::Exact)
            }
            None => WindowRate::at(self.size, now, current_diff.unwrap_or(0.0), 0.0),
        }
    }

    /// Like [`WindowTable::rate`], but a key the table does not hold yet is added (cap
    /// permitting) so that the next sync fetches its cluster total.
    pub fn rate_tracked(&self, key: &str, now: UnixMs) -> WindowRate {
        let map = self.map.pin();
        let entry = match map.get(key) {
            Some(e) => e,
            None if self.make_room(now).is_ok() => {
                map.get_or_insert_with(key.into(), || Entry::new(now.secs()))
            }
            None => return WindowRate::at(self.size, now, 0.0, 0.0),
        };
        entry.touch(now.secs());
        self.rate_of(entry, now, None, View::Exact)
    }

    /// Whether the table holds the key at all.
    pub fn contains(&self, key: &str) -> bool {
        self.map.pin().contains_key(key)
    }

    fn rate_of(&self, e: &Entry, now: UnixMs, current_diff: Option<f64>, view: View) -> WindowRate {
        let size = self.size.secs();
        let start = self.size.start_of(now);
        let (synced, diff) = e.parts_of(start, size, view);
        let current = synced + current_diff.unwrap_or(diff);
        let (prev_synced, prev_diff) = e.parts_of(start - i64::from(size), size, view);
        let previous = prev_synced + prev_diff;
        WindowRate::at(self.size, now, current, previous)
    }

    /// Takes every non-zero diff, including those of windows that rolled over, each
    /// window once. An increment racing with the drain is in this batch or left for the
    /// next, never both. Also drops entries whose windows have all expired and that hold
    /// no diff. One walk of the table: [`WindowTable::drain_in_slices`] takes it a slice
    /// of keys at a time.
    pub fn drain(&self, now: UnixMs) -> Vec<Diff> {
        let mut slices = self.drain_in_slices_of(Vec::new());
        let map = self.map.pin();
        let mut expired = Vec::new();
        for (key, e) in map.iter() {
            self.drain_entry(key, e, now, &mut slices.drained, &mut expired);
        }
        self.retire_expired(&map, expired, now);
        self.drained();
        slices.finish()
    }

    /// A drain has ended: what it took may be evicted, and a table found full while it
    /// ran is scanned again (a drain counts at its start and at its end: two scans at
    /// most per drain of a full table).
    fn drained(&self) {
        self.drains.fetch_add(1, Ordering::SeqCst);
    }

    /// A drain taken a slice of keys at a time ([`WindowTable::drain_slice`]), so that
    /// no one call walks a large table: what the table holds for its store moves into
    /// the drain as each slice is taken (the diffs of windows that rolled over at once),
    /// and [`DrainSlices::finish`] answers it as [`WindowTable::drain`] does. Keys added
    /// after this call wait for the next drain.
    pub fn drain_in_slices(&self) -> DrainSlices {
        self.drain_in_slices_of(self.keys())
    }

    fn drain_in_slices_of(&self, keys: Vec<CompactString>) -> DrainSlices {
        // from here on, entries with diffs may become evictable again
        self.drains.fetch_add(1, Ordering::SeqCst);
        let overflow =
            std::mem::take(&mut *self.overflow.lock().unwrap_or_else(|p| p.into_inner()));
        DrainSlices {
            keys,
            next: 0,
            overflow,
            drained: Vec::new(),
        }
    }

    /// Drains the next `max` keys of `slices` (at least one). `false` once every key is
    /// drained.
    pub fn drain_slice(&self, slices: &mut DrainSlices, max: usize, now: UnixMs) -> bool {
        let end = slices.keys.len().min(slices.next + max.max(1));
        let map = self.map.pin();
        let mut expired = Vec::new();
        for key in &slices.keys[slices.next..end] {
            if let Some(e) = map.get(key.as_str()) {
                self.drain_entry(key, e, now, &mut slices.drained, &mut expired);
            }
        }
        self.retire_expired(&map, expired, now);
        slices.next = end;
        let more = end < slices.keys.len();
        if !more {
            self.drained();
        }
        more
    }

    fn drain_entry(
        &self,
        key: &CompactString,
        e: &Entry,
        now: UnixMs,
        out: &mut Vec<Diff>,
        expired: &mut Vec<CompactString>,
    ) {
        let size = self.size.secs();
        if e.has_diff() {
            e.drain(&mut |start, value| {
                out.push(Diff {
                    key: key.clone(),
                    window_size: size,
                    window_start: start,
                    value,
                })
            });
        } else if e.expired(self.size.previous_start_of(now)) {
            expired.push(key.clone());
        }
    }

    fn retire_expired(&self, map: &MapRef<'_>, expired: Vec<CompactString>, now: UnixMs) {
        let oldest_live = self.size.previous_start_of(now);
        for key in expired {
            if let Some(e) = map.get(&key) {
                if e.expired(oldest_live) && e.retire(self.options.retention, oldest_live) {
                    self.remove_retired(map, &key, e);
                }
            }
        }
    }

    /// Puts diffs back after a failed push; those whose window left the entry meanwhile
    /// wait in the overflow list for the next drain.
    pub fn restore(&self, diffs: Vec<Diff>) {
        let size = self.size.secs();
        let map = self.map.pin();
        for d in diffs {
            let back = map
                .get(d.key.as_str())
                .is_some_and(|e| e.restore(d.window_start, size, d.value));
            if !back {
                self.spill(&d.key, d.window_start, d.value);
            }
        }
    }

    /// Overwrites the synced totals of the given windows. With `create`, keys the table
    /// does not hold are added (warm-up), as far as the cap allows.
    pub fn apply(&self, totals: &[Total], now: UnixMs, create: bool) {
        let size = self.size.secs();
        let oldest_live = self.size.previous_start_of(now);
        let map = self.map.pin();
        for t in totals {
            if t.window_start < oldest_live {
                continue;
            }
            let entry = match map.get(t.key.as_str()) {
                Some(e) => e,
                None if create && self.make_room(now).is_ok() => {
                    map.get_or_insert_with(t.key.clone(), || Entry::new(now.secs()))
                }
                None => continue,
            };
            let mut spill = |s, v| self.spill(&t.key, s, v);
            entry.apply(t.window_start, size, t.count, &mut spill);
        }
    }

    /// Writes the synced totals of keys the table does not hold (adding them, as far as
    /// the cap allows) and leaves every key it holds as it is: a read sent before the
    /// key was counted or read again, landing after, holds older news than the table.
    pub fn fill(&self, totals: &[Total], now: UnixMs) {
        let size = self.size.secs();
        let oldest_live = self.size.previous_start_of(now);
        let map = self.map.pin();
        // keys added by this call: their other windows are filled too
        let mut added: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for t in totals {
            if t.window_start < oldest_live {
                continue;
            }
            let entry = match map.get(t.key.as_str()) {
                Some(e) if added.contains(t.key.as_str()) => e,
                Some(_) => continue,
                None if self.make_room(now).is_ok() => {
                    added.insert(t.key.as_str());
                    map.get_or_insert_with(t.key.clone(), || Entry::new(now.secs()))
                }
                None => continue,
            };
            let mut spill = |s, v| self.spill(&t.key, s, v);
            entry.apply(t.window_start, size, t.count, &mut spill);
        }
    }

    /// Forgets the key: its counts and any hits not yet pushed (a reset). A hit racing
    /// with it may land on either side.
    pub fn reset(&self, key: &str) {
        self.map.pin().remove(key);
    }

    /// Every key the table holds.
    pub fn keys(&self) -> Vec<CompactString> {
        self.map.pin().keys().cloned().collect()
    }

    /// Evicts least recently used entries that lose nothing once the cap is reached: in a
    /// synced table those without unsynced diffs (the store holds their counts), in a
    /// local-only one those whose windows no longer weigh (the table is their only
    /// record: a key at its limit evicted by other keys' churn would start again at 0).
    /// Down to 90 % of the cap, so the scan is paid once per tenth of the cap inserts.
    /// When that leaves the table full, new keys are refused (`CapacityExceeded`, the
    /// namespace's memory is full) without another scan until the next drain.
    fn make_room(&self, now: UnixMs) -> Result<(), CoreError> {
        let max = self.options.max_counters;
        if self.map.len() < max {
            return Ok(());
        }
        let full = || CoreError::CapacityExceeded {
            namespace: self.namespace.to_string(),
            max,
        };
        let drains = self.drains.load(Ordering::SeqCst);
        if self.full_at.load(Ordering::SeqCst) == drains {
            return Err(full());
        }
        let _guard = self.evict_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.map.len() < max {
            return Ok(());
        }
        if self.full_at.load(Ordering::SeqCst) == drains {
            return Err(full());
        }
        let map = self.map.pin();
        let oldest_live = self.size.previous_start_of(now);
        let loses_nothing = |e: &Entry| match self.options.retention {
            Retention::Synced => !e.has_diff(),
            Retention::LocalOnly => e.expired(oldest_live),
        };
        let mut candidates: Vec<(u32, CompactString)> = map
            .iter()
            .filter(|(_, e)| loses_nothing(e))
            .map(|(k, e)| (e.last_used(), k.clone()))
            .collect();
        let target = max - max / 10;
        let excess = self.map.len().saturating_sub(target.max(1) - 1);
        let n = excess.min(candidates.len());
        if n > 0 && n < candidates.len() {
            candidates.select_nth_unstable_by_key(n - 1, |(t, _)| *t);
        }
        for (_, key) in candidates.into_iter().take(n) {
            if let Some(e) = map.get(&key) {
                if e.retire(self.options.retention, oldest_live) {
                    self.remove_retired(&map, &key, e);
                    self.evictions.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if self.map.len() < max {
            Ok(())
        } else {
            self.full_at.store(drains, Ordering::SeqCst);
            Err(full())
        }
    }

    /// Removes `key` only while it still maps to the retired `entry`.
    fn remove_retired(&self, map: &MapRef<'_>, key: &str, entry: &Entry) {
        let _ = map.remove_if(key, |_, v| std::ptr::eq(v, entry));
    }
}

/// A value may be counted: finite and below [`MAX_COUNT`] (2^53) in magnitude. The bound
/// is exclusive: a decimal a client sends past 2^53 (9007199254740993) parses to the
/// double 2^53, so only refusing 2^53 itself refuses every value past it.
pub fn check_value(value: f64) -> Result<(), CoreError> {
    if !value.is_finite() {
        return Err(CoreError::NonFiniteValue(value));
    }
    if value.abs() >= MAX_COUNT {
        return Err(CoreError::CountOutOfRange {
            value,
            max: MAX_COUNT,
        });
    }
    Ok(())
}

type MapRef<'a> = papaya::HashMapRef<'a, CompactString, Entry, Hasher, papaya::LocalGuard<'a>>;
