//! Atomic `f64` cells and the per-thread stripes a hot key spreads its hits over.
//!
//! Counts are `f64` so fractional and negative increments work; integer increments sum
//! exactly up to 2^53 because every partial sum of integers below that is representable.

use std::cell::Cell;
use std::sync::atomic::AtomicUsize;

use crate::sync::{AtomicI64, AtomicU32, AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

/// An `f64` updated with compare-and-swap. Read-modify-writes are `SeqCst`: the eviction
/// protocol in `entry.rs` relies on them being ordered against the `retired` flag.
#[derive(Debug, Default)]
pub(crate) struct AtomicF64(AtomicU64);

impl AtomicF64 {
    pub(crate) fn load(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::SeqCst))
    }

    pub(crate) fn store(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::SeqCst);
    }

    /// One compare-and-swap attempt; `false` when another thread got there first.
    pub(crate) fn try_add(&self, v: f64) -> bool {
        let cur = self.0.load(Ordering::Relaxed);
        let new = (f64::from_bits(cur) + v).to_bits();
        self.0
            .compare_exchange(cur, new, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }

    pub(crate) fn add(&self, v: f64) {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let new = (f64::from_bits(cur) + v).to_bits();
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::SeqCst, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }

    /// Takes the value, leaving zero.
    pub(crate) fn take(&self) -> f64 {
        f64::from_bits(self.0.swap(0f64.to_bits(), Ordering::SeqCst))
    }

    /// Moves the value into `into` (written only by the caller meanwhile), `into` first:
    /// a reader that loads this cell and then `into` sees the value once or twice for a
    /// moment, never in neither. Exact: the cell is zeroed only if it still holds what
    /// was added; a racing add makes it try again.
    pub(crate) fn move_into(&self, into: &AtomicF64) -> f64 {
        loop {
            let bits = self.0.load(Ordering::SeqCst);
            let d = f64::from_bits(bits);
            if d == 0.0 {
                return 0.0;
            }
            let before = into.load();
            into.store(before + d);
            let zero = 0f64.to_bits();
            if self
                .0
                .compare_exchange(bits, zero, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return d;
            }
            into.store(before);
        }
    }
}

/// How many stripes a hot key gets. Threads beyond this share stripes, which stays
/// correct and only costs contention.
pub(crate) const STRIPES: usize = 8;

/// How many of its own hits a thread answers from its snapshot of the other stripes
/// before reading them again.
const REFRESH_EVERY: u32 = 16;

/// One thread's cache line: its diffs for both windows and its snapshot of the others.
#[derive(Debug, Default)]
struct StripeCell {
    diff: [AtomicF64; 2],
    /// Sum of the other stripes' diffs when last read, per slot.
    others: [AtomicF64; 2],
    snap_ms: AtomicI64,
    snap_generation: AtomicU32,
    ops_since_snap: AtomicU32,
}

/// Per-thread diff cells for both windows of one hot key, each thread's on its own cache
/// line so two threads hitting the key never write the same line.
///
/// An increment's answer reads this thread's cell exactly and the other cells through a
/// snapshot refreshed every [`REFRESH_EVERY`] hits, every millisecond, and after every
/// drain or roll (`generation`): reading a line another core writes on every hit would
/// cost a cache miss per hit and undo the striping. So an increment on a hot key may miss
/// at most the last 16 hits (or 1 ms) of each other thread; reads, drains and syncs sum
/// the cells exactly.
#[derive(Debug, Default)]
pub(crate) struct Stripes {
    cells: [CachePadded<StripeCell>; STRIPES],
    generation: AtomicU32,
}

impl Stripes {
    pub(crate) fn mine(&self, slot: usize) -> &AtomicF64 {
        &self.cells[stripe_of_this_thread()].diff[slot]
    }

    pub(crate) fn sum(&self, slot: usize) -> f64 {
        self.cells.iter().map(|c| c.diff[slot].load()).sum()
    }

    /// This thread's view of the slot's diff (see the type's comment).
    pub(crate) fn view(&self, slot: usize, now_ms: i64) -> f64 {
        let me = stripe_of_this_thread();
        let cell = &self.cells[me];
        let generation = self.generation.load(Ordering::Acquire);
        let ops = cell.ops_since_snap.load(Ordering::Relaxed);
        if ops >= REFRESH_EVERY
            || cell.snap_ms.load(Ordering::Relaxed) != now_ms
            || cell.snap_generation.load(Ordering::Relaxed) != generation
        {
            for s in 0..2 {
                let others: f64 = (0..STRIPES)
                    .filter(|&i| i != me)
                    .map(|i| self.cells[i].diff[s].load())
                    .sum();
                cell.others[s].store(others);
            }
            cell.snap_ms.store(now_ms, Ordering::Relaxed);
            cell.snap_generation.store(generation, Ordering::Relaxed);
            cell.ops_since_snap.store(0, Ordering::Relaxed);
        } else {
            cell.ops_since_snap.store(ops + 1, Ordering::Relaxed);
        }
        cell.diff[slot].load() + cell.others[slot].load()
    }

    /// Takes the slot's diffs, leaving zero, and invalidates every snapshot.
    /// Moves every cell's diff of `slot` into `into` ([`AtomicF64::move_into`]).
    pub(crate) fn move_into(&self, slot: usize, into: &AtomicF64) -> f64 {
        let v = self
            .cells
            .iter()
            .map(|c| c.diff[slot].move_into(into))
            .sum();
        self.generation.fetch_add(1, Ordering::AcqRel);
        v
    }

    pub(crate) fn take(&self, slot: usize) -> f64 {
        let v = self.cells.iter().map(|c| c.diff[slot].take()).sum();
        self.generation.fetch_add(1, Ordering::AcqRel);
        v
    }

    pub(crate) fn any_nonzero(&self) -> bool {
        self.cells
            .iter()
            .any(|c| c.diff[0].load() != 0.0 || c.diff[1].load() != 0.0)
    }
}

fn stripe_of_this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    STRIPE.with(|s| {
        let mut v = s.get();
        if v == usize::MAX {
            v = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % STRIPES;
            s.set(v);
        }
        v
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_sums_are_exact_near_2_pow_53() {
        let c = AtomicF64::default();
        c.store(2f64.powi(53) - 10.0);
        for _ in 0..10 {
            c.add(1.0);
        }
        assert_eq!(c.load(), 2f64.powi(53));
        assert_eq!(c.take(), 2f64.powi(53));
        assert_eq!(c.load(), 0.0);
    }

    #[test]
    fn stripes_sum_and_take() {
        let s = Stripes::default();
        s.mine(0).add(2.0);
        s.mine(1).add(-1.5);
        assert!(s.any_nonzero());
        assert_eq!(s.sum(0), 2.0);
        assert_eq!(s.take(1), -1.5);
        assert_eq!(s.take(0), 2.0);
        assert!(!s.any_nonzero());
    }

    #[test]
    fn the_view_of_one_thread_is_exact_and_refreshes_after_take() {
        let s = Stripes::default();
        s.mine(0).add(3.0);
        assert_eq!(s.view(0, 1), 3.0);
        s.mine(0).add(1.0);
        assert_eq!(s.view(0, 1), 4.0);
        s.cells[(stripe_of_this_thread() + 1) % STRIPES].diff[0].add(5.0);
        assert_eq!(s.view(0, 2), 9.0); // a new millisecond refreshes the snapshot
        assert_eq!(s.take(0), 9.0);
        assert_eq!(s.view(0, 2), 0.0); // the generation changed
    }
}
