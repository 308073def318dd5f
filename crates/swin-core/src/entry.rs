//! One key's counters for one window size: the two windows the sliding rate reads.
//!
//! The two windows live in a ring of two slots indexed by `(start / size) mod 2`, so the
//! current and the previous window never share a slot and a slot is reused once its
//! window is older than the previous one.
//!
//! Hot path (an increment to a window the slot already holds) takes no lock: a load of
//! the slot's start, one compare-and-swap on the diff (or on this thread's stripe once
//! the key has shown contention), and a load of `retired`. The entry's mutex is taken
//! only to roll a slot to a new window, to drain, to apply store totals and to retire.
//!
//! Eviction protocol (why a racing increment is never lost): the evictor sets `retired`
//! then reads the diffs; an incrementer adds to a diff then reads `retired`. Both use
//! `SeqCst`, so at least one sees the other. If the evictor saw a diff it backs off. An
//! incrementer that sees `retired` does not know whether its hit was seen (a drain may
//! have taken it in between), so it never takes the hit back: it moves whatever diff the
//! entry still holds to the table's overflow list under the entry lock
//! ([`Entry::flush_retired`]). Diffs are only ever moved by swapping them out, so each
//! hit is drained from the entry or from the overflow list, exactly once.
//!
//! Known edge: a thread whose `now` is two whole windows behind the thread that rolls the
//! slot can land its hit in the newer window (still counted exactly once).

use std::sync::OnceLock;

use crate::cell::{AtomicF64, Stripes};
use crate::sync::{AtomicBool, AtomicI64, AtomicU32, Mutex, MutexGuard, Ordering};

const EMPTY: i64 = i64::MIN;

#[derive(Debug)]
struct Slot {
    start: AtomicI64,
    /// Cluster total last read from a store (plus drained diffs not yet confirmed).
    synced: AtomicF64,
    /// Local hits not yet drained (uncontended keys; hot keys use `Entry::stripes`).
    diff: AtomicF64,
}

impl Slot {
    fn new() -> Self {
        Slot {
            start: AtomicI64::new(EMPTY),
            synced: AtomicF64::default(),
            diff: AtomicF64::default(),
        }
    }
}

/// What happens to hits once their window has passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Diffs are kept until drained by a sync, even when their window rolls over.
    Synced,
    /// Nothing ever drains: an expired window's hits are simply forgotten.
    LocalOnly,
}

/// What happened to an add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Added {
    Counted,
    /// The entry was being evicted: the caller must call [`Entry::flush_retired`].
    Retired,
}

/// How exactly to read a hot key's striped diffs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum View {
    Exact,
    Hot { now_ms: i64 },
}

#[derive(Debug)]
pub(crate) struct Entry {
    slots: [Slot; 2],
    stripes: OnceLock<Box<Stripes>>,
    lock: Mutex<()>,
    retired: AtomicBool,
    /// Unix seconds of the last increment or read, for LRU eviction and active keys.
    last_used: AtomicU32,
}

pub(crate) fn slot_index(start: i64, size: u32) -> usize {
    start.div_euclid(i64::from(size)).rem_euclid(2) as usize
}

fn secs_u32(secs: i64) -> u32 {
    u32::try_from(secs.max(0)).unwrap_or(u32::MAX)
}

impl Entry {
    pub(crate) fn new(now_secs: i64) -> Self {
        Entry {
            slots: [Slot::new(), Slot::new()],
            stripes: OnceLock::new(),
            lock: Mutex::new(()),
            retired: AtomicBool::new(false),
            last_used: AtomicU32::new(secs_u32(now_secs)),
        }
    }

    fn locked(&self) -> MutexGuard<'_, ()> {
        // The mutex guards no data of its own; a panic elsewhere cannot leave it torn.
        self.lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn touch(&self, now_secs: i64) {
        let now = secs_u32(now_secs);
        // Only write when the second changes: a hot key must not dirty this line per hit.
        if self.last_used.load(Ordering::Relaxed) < now {
            self.last_used.store(now, Ordering::Relaxed);
        }
    }

    pub(crate) fn last_used(&self) -> u32 {
        self.last_used.load(Ordering::Relaxed)
    }

    fn diff_of(&self, idx: usize) -> f64 {
        let base = self.slots[idx].diff.load();
        match self.stripes.get() {
            Some(st) => base + st.sum(idx),
            None => base,
        }
    }

    /// This thread's view of the diff, cheap on a hot key (see `Stripes::view`).
    fn diff_view(&self, idx: usize, now_ms: i64) -> f64 {
        let base = self.slots[idx].diff.load();
        match self.stripes.get() {
            Some(st) => base + st.view(idx, now_ms),
            None => base,
        }
    }

    fn take_diff(&self, idx: usize) -> f64 {
        let base = self.slots[idx].diff.take();
        match self.stripes.get() {
            Some(st) => base + st.take(idx),
            None => base,
        }
    }

    pub(crate) fn has_diff(&self) -> bool {
        self.slots[0].diff.load() != 0.0
            || self.slots[1].diff.load() != 0.0
            || self.stripes.get().is_some_and(|s| s.any_nonzero())
    }

    /// Makes the slot for `start` hold that window, rolling an older window out.
    /// Returns `None` when the slot already holds a newer window (the caller is stale).
    /// A rolled-out window's undrained diff is handed to `spill`.
    pub(crate) fn prepare(
        &self,
        start: i64,
        size: u32,
        spill: &mut dyn FnMut(i64, f64),
    ) -> Option<usize> {
        let idx = slot_index(start, size);
        let slot = &self.slots[idx];
        let held = slot.start.load(Ordering::Acquire);
        if held == start {
            return Some(idx);
        }
        if held != EMPTY && held > start {
            return None;
        }
        let _guard = self.locked();
        let held = slot.start.load(Ordering::Acquire);
        if held == start {
            return Some(idx);
        }
        if held != EMPTY && held > start {
            return None;
        }
        let pending = self.take_diff(idx);
        if pending != 0.0 && held != EMPTY {
            spill(held, pending);
        }
        slot.synced.store(0.0);
        slot.start.store(start, Ordering::Release);
        Some(idx)
    }

    /// Adds `value` to the diff of slot `idx` (prepared by the caller).
    pub(crate) fn add(&self, idx: usize, value: f64) -> Added {
        match self.stripes.get() {
            Some(st) => st.mine(idx).add(value),
            None => {
                if !self.slots[idx].diff.try_add(value) {
                    // Contention: this key is hot. Give it per-thread stripes from now on.
                    self.stripes.get_or_init(Box::default).mine(idx).add(value);
                }
            }
        }
        crate::sync::seq_cst_point();
        if self.retired.load(Ordering::SeqCst) {
            return Added::Retired;
        }
        Added::Counted
    }

    /// `(synced, diff)` of the window starting at `start`, zeros when the entry does not
    /// hold it. `View::Exact` sums every stripe; `View::Hot` is an increment's cheap view.
    /// The diff is read first: a drain raises `synced` before it zeroes a diff, so a read
    /// that overlaps one sees a drained hit once (or, for a moment, twice), never in
    /// neither half.
    pub(crate) fn parts_of(&self, start: i64, size: u32, view: View) -> (f64, f64) {
        let idx = slot_index(start, size);
        let slot = &self.slots[idx];
        if slot.start.load(Ordering::Acquire) != start {
            return (0.0, 0.0);
        }
        let diff = match view {
            View::Exact => self.diff_of(idx),
            View::Hot { now_ms } => self.diff_view(idx, now_ms),
        };
        (slot.synced.load(), diff)
    }

    /// Moves every non-zero diff into `synced` (so this node's view does not dip while
    /// the push is in flight) and reports it as `(window_start, diff)`.
    pub(crate) fn drain(&self, out: &mut dyn FnMut(i64, f64)) {
        let _guard = self.locked();
        for idx in 0..2 {
            let slot = &self.slots[idx];
            let start = slot.start.load(Ordering::Acquire);
            if start == EMPTY {
                continue;
            }
            // `synced` is written only under the lock
            let mut d = slot.diff.move_into(&slot.synced);
            if let Some(st) = self.stripes.get() {
                d += st.move_into(idx, &slot.synced);
            }
            if d != 0.0 {
                out(start, d);
            }
        }
    }

    /// Puts a drained diff back after a failed push. `false` when the window is gone
    /// from the entry (the caller keeps the diff elsewhere).
    pub(crate) fn restore(&self, start: i64, size: u32, value: f64) -> bool {
        let _guard = self.locked();
        let idx = slot_index(start, size);
        let slot = &self.slots[idx];
        if self.retired.load(Ordering::SeqCst) || slot.start.load(Ordering::Acquire) != start {
            return false;
        }
        slot.diff.add(value);
        slot.synced.store(slot.synced.load() - value);
        true
    }

    /// Overwrites `synced` of the window with a store total.
    pub(crate) fn apply(&self, start: i64, size: u32, total: f64, spill: &mut dyn FnMut(i64, f64)) {
        if let Some(idx) = self.prepare(start, size, spill) {
            let _guard = self.locked();
            if self.slots[idx].start.load(Ordering::Acquire) == start {
                self.slots[idx].synced.store(total);
            }
        }
    }

    /// True when neither slot holds a window at or after `oldest_live` and the key was
    /// not used since (a key read but never counted is still wanted by the next sync).
    pub(crate) fn expired(&self, oldest_live: i64) -> bool {
        i64::from(self.last_used()) < oldest_live
            && self
                .slots
                .iter()
                .all(|s| s.start.load(Ordering::Acquire) < oldest_live)
    }

    /// Marks the entry dead if nothing in it would be lost: with [`Retention::Synced`], no
    /// unsynced diff (the store holds the rest); with [`Retention::LocalOnly`], where the
    /// entry is the only record, no window that still weighs (none starting at
    /// `oldest_live` or later). After `true`, any add that races with this call sees
    /// `retired` (see the module comment).
    pub(crate) fn retire(&self, retention: Retention, oldest_live: i64) -> bool {
        let _guard = self.locked();
        if self.retired.load(Ordering::SeqCst) {
            // retired for good by another eviction, whose caller removes it: a second
            // one (the sync's drain and a table making room both found it) must not
            // bring it back, nor remove it twice
            return false;
        }
        self.retired.store(true, Ordering::SeqCst);
        crate::sync::seq_cst_point();
        let keep = match retention {
            Retention::Synced => self.has_diff(),
            // a window is rolled in under the lock held here: one rolled in before is
            // seen, one after finds `retired`
            Retention::LocalOnly => self
                .slots
                .iter()
                .any(|s| s.start.load(Ordering::Acquire) >= oldest_live),
        };
        if keep {
            self.retired.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }
}

impl Entry {
    /// Whether the entry is retired for good: an add that saw `retired` may have seen an
    /// eviction that then kept the entry (it holds something that would be lost); the
    /// eviction decides under the lock taken here.
    pub(crate) fn is_retired(&self) -> bool {
        let _guard = self.locked();
        self.retired.load(Ordering::SeqCst)
    }

    /// Called by an incrementer that saw `retired`: moves every diff still held to
    /// `spill`, so hits that raced with the eviction reach the overflow list.
    pub(crate) fn flush_retired(&self, spill: &mut dyn FnMut(i64, f64)) {
        let _guard = self.locked();
        for idx in 0..2 {
            let start = self.slots[idx].start.load(Ordering::Acquire);
            let d = self.take_diff(idx);
            if d != 0.0 && start != EMPTY {
                spill(start, d);
            }
        }
    }
}

#[cfg(test)]
mod retire_tests {
    use super::{Added, Entry, Retention};

    const SIZE: u32 = 60;

    /// Two evictions of one local-only entry, one after the other (the sync's drain and
    /// a table making room both found it expired): the second does not bring the dead
    /// entry back — an increment that rolled a window into it after the first sees it
    /// dead and counts its hit again in a new entry (it used to be told "kept", its hit
    /// left in an entry no longer in the table).
    #[test]
    fn a_second_retire_does_not_bring_a_dead_local_only_entry_back() {
        let e = Entry::new(0);
        let i0 = e.prepare(0, SIZE, &mut |_, _| {}).expect("a fresh slot");
        e.add(i0, 5.0);
        let later = 2 * i64::from(SIZE);
        assert!(
            e.retire(Retention::LocalOnly, i64::from(SIZE)),
            "first eviction"
        );
        let i = e
            .prepare(later, SIZE, &mut |_, _| {})
            .expect("newer window");
        assert_eq!(e.add(i, 1.0), Added::Retired);
        assert!(!e.retire(Retention::LocalOnly, i64::from(SIZE)));
        assert!(e.is_retired(), "the dead entry stays dead");
    }

    /// The same for a synced entry: after a second eviction, an add by a thread that
    /// still holds the removed entry sees it retired (and flushes its diff to the
    /// overflow list) rather than being counted in it.
    #[test]
    fn a_second_retire_does_not_bring_a_dead_synced_entry_back() {
        let e = Entry::new(0);
        let i0 = e.prepare(0, SIZE, &mut |_, _| {}).expect("a fresh slot");
        assert!(e.retire(Retention::Synced, 0), "first eviction");
        assert_eq!(e.add(i0, 1.0), Added::Retired);
        assert!(!e.retire(Retention::Synced, 0));
        assert_eq!(
            e.add(i0, 1.0),
            Added::Retired,
            "an add into a removed entry"
        );
    }
}
