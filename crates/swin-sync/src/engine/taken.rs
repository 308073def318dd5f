//! What a sync's drain took from a namespace's tables and buckets, held so that nothing
//! drained is lost when the sync goes away before it pushes: dropped, each guard puts
//! what it holds back (see `rows.rs` for the drains that use them).

use std::sync::{Arc, Mutex};

use swin_core::{Advance, Diff, DrainSlices, UnixMs};

use super::nanos;
use crate::store::normalize_advances;

/// Keys of a table drained per call off the runtime: a large table's drain goes in
/// slices, so that no one call holds a core while requests wait for it (about 60 µs
/// a slice here, where one walk of 100,000 keys took 6-18 ms; BENCHMARKS.md). A table
/// of up to twice this many keys is drained in one walk.
pub(super) const DRAIN_SLICE: usize = 1_000;

/// What a drain took from a namespace's buckets, as [`Taken`] is for its tables: the
/// push's once the drain answers ([`AdvancesTaken::all`]); dropped before that (a sync
/// that went away while the call ran), back in the buckets.
pub(super) struct AdvancesTaken {
    counters: Arc<swin_core::NamespaceCounters>,
    pub(super) slot: Arc<Mutex<BucketSlot>>,
}

/// A buckets' drain, as its call off the runtime takes it (as [`Slot`] is a table's).
pub(super) enum BucketSlot {
    /// The call has not run.
    Waiting,
    /// What the call took.
    Took(Vec<Advance>),
    /// Taken by the sync or put back: a call that runs now takes nothing.
    Closed,
}

impl AdvancesTaken {
    pub(super) fn new(counters: Arc<swin_core::NamespaceCounters>) -> AdvancesTaken {
        AdvancesTaken {
            counters,
            slot: Arc::new(Mutex::new(BucketSlot::Waiting)),
        }
    }

    fn close(&self) -> Vec<Advance> {
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match std::mem::replace(&mut *slot, BucketSlot::Closed) {
            BucketSlot::Took(advances) => advances,
            BucketSlot::Waiting | BucketSlot::Closed => Vec::new(),
        }
    }

    pub(super) fn all(self) -> Vec<Advance> {
        self.close()
    }
}

impl Drop for AdvancesTaken {
    fn drop(&mut self) {
        let left = self.close();
        if !left.is_empty() {
            self.counters.buckets().restore(&left);
        }
    }
}

/// The call off the runtime of a buckets' drain: takes every pending advance into
/// `slot`, unless its sync went away first.
pub(super) fn take_advances(
    counters: &swin_core::NamespaceCounters,
    slot: &Mutex<BucketSlot>,
    now: UnixMs,
) {
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if matches!(*slot, BucketSlot::Waiting) {
        *slot = BucketSlot::Took(normalize_advances(&counters.buckets().drain(nanos(now))));
    }
}

/// What a drain took from a namespace's tables, table by table: the push's once the
/// drain is complete ([`Taken::all`]). Dropped before that — a slice the stopping
/// runtime did not run, or a sync that went away mid-drain — it goes back into the
/// tables, as a failed push's diffs do: a drained hit is never only in a dropped value.
pub(super) struct Taken {
    pub(super) counters: Arc<swin_core::NamespaceCounters>,
    pub(super) done: Vec<(usize, Vec<Diff>)>,
    /// The table being drained and its drain, shared with the call off the runtime in
    /// flight or queued: dropping this waits for a call that runs, and closes the slot
    /// to one that has yet to run.
    pub(super) open: Option<(usize, Arc<Mutex<Slot>>)>,
}

/// One table's drain, as the calls off the runtime take it.
pub(super) enum Slot {
    /// No call has run yet.
    Waiting,
    /// A small table, drained in one walk.
    Whole(Vec<Diff>),
    /// A large table's drain, a slice at a time.
    Open(DrainSlices),
    /// Taken by the sync (or put back): a call that runs now takes nothing.
    Closed,
}

/// One call's part of a table's drain (see [`Slot`]): whether more is left.
pub(super) fn take_slice(t: &swin_core::WindowTable, slot: &Mutex<Slot>, now: UnixMs) -> bool {
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    match &mut *slot {
        // the sync went away before this call ran: nothing is taken
        Slot::Closed | Slot::Whole(_) => false,
        // a small table: one walk, no list of keys
        Slot::Waiting if t.len() <= 2 * DRAIN_SLICE => {
            *slot = Slot::Whole(t.drain(now));
            false
        }
        // in the slot before a slice is taken: what it takes is the guard's at once
        Slot::Waiting => {
            *slot = Slot::Open(t.drain_in_slices());
            match &mut *slot {
                Slot::Open(s) => t.drain_slice(s, DRAIN_SLICE, now),
                _ => false,
            }
        }
        Slot::Open(s) => t.drain_slice(s, DRAIN_SLICE, now),
    }
}

impl Taken {
    pub(super) fn close(&mut self) {
        if let Some((table, slot)) = self.open.take() {
            let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            let taken = match std::mem::replace(&mut *slot, Slot::Closed) {
                Slot::Whole(d) => d,
                Slot::Open(s) => s.finish(),
                Slot::Waiting | Slot::Closed => Vec::new(),
            };
            self.done.push((table, taken));
        }
    }

    pub(super) fn all(mut self) -> Vec<Diff> {
        self.close();
        std::mem::take(&mut self.done)
            .into_iter()
            .flat_map(|(_, d)| d)
            .collect()
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        self.close();
        for (table, diffs) in self.done.drain(..) {
            if !diffs.is_empty() {
                self.counters.tables()[table].restore(diffs);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use swin_core::{CounterOptions, NamespaceCounters, UnixMs, WindowSize};

    use super::{take_advances, take_slice, AdvancesTaken, Slot, Taken, DRAIN_SLICE};

    const NOW: UnixMs = UnixMs(1_700_000_000_000);

    fn counters(keys: usize) -> Arc<NamespaceCounters> {
        let size = WindowSize::new(60).expect("size");
        let c = Arc::new(NamespaceCounters::new(
            "api",
            &[size],
            CounterOptions::default(),
        ));
        let t = c.table(60).expect("table");
        for i in 0..keys {
            t.increment(&format!("k{i}"), (i % 7 + 1) as f64, NOW)
                .expect("counted");
        }
        c
    }

    fn expected(keys: usize) -> f64 {
        (0..keys).map(|i| (i % 7 + 1) as f64).sum()
    }

    /// A call of the drain that runs after its sync went away (its future dropped while
    /// the call waited for a thread) takes nothing: every hit stays in the table.
    #[test]
    fn a_slice_that_runs_after_its_sync_went_away_takes_nothing() {
        for keys in [10, 3 * DRAIN_SLICE] {
            let c = counters(keys);
            let t = c.table(60).expect("table");
            let slot = Arc::new(Mutex::new(Slot::Waiting));
            drop(Taken {
                counters: c.clone(),
                done: Vec::new(),
                open: Some((0, slot.clone())),
            });
            assert!(!take_slice(t, &slot, NOW), "nothing more to take");
            let all = t.drain(NOW);
            assert_eq!(all.len(), keys);
            assert_eq!(all.iter().map(|d| d.value).sum::<f64>(), expected(keys));
        }
    }

    /// A buckets' drain whose sync went away after the call ran puts its advances back;
    /// one that runs after its sync went away takes nothing.
    #[test]
    fn a_buckets_drain_dropped_after_it_ran_puts_back_what_it_took() {
        let c = counters(0);
        let gcra = swin_core::Gcra::new(10, 10, Duration::from_secs(60)).expect("gcra");
        let now_ns = super::nanos(NOW);
        for key in ["a", "b"] {
            let d = c
                .buckets()
                .spend(&gcra, key, now_ns, 3, false)
                .expect("spent");
            assert!(d.allowed);
        }
        let taken = AdvancesTaken::new(c.clone());
        take_advances(&c, &taken.slot, NOW);
        drop(taken); // the sync went away before it read what the call took
        let back = c.buckets().drain(now_ns);
        assert_eq!(back.len(), 2, "{back:?}");
        c.buckets().restore(&back);
        let late = AdvancesTaken::new(c.clone());
        let slot = late.slot.clone();
        drop(late);
        take_advances(&c, &slot, NOW);
        assert_eq!(
            c.buckets().drain(now_ns),
            back,
            "nothing taken by a late call"
        );
    }

    /// A drain dropped part way (a slice the stopping runtime did not run, a sync that
    /// went away) puts what it took back into the tables: the next drain has every hit.
    #[test]
    fn a_drain_dropped_part_way_puts_back_what_it_took() {
        let keys = 2_500;
        let c = counters(keys);
        let t = c.table(60).expect("table");
        let done = t.drain(NOW); // as if an earlier table of the namespace
        t.restore(done[..100].to_vec());
        t.restore(done[100..].to_vec());
        let done = t.drain(NOW);
        t.restore(done[..500].to_vec());
        let mut slices = t.drain_in_slices();
        t.drain_slice(&mut slices, 200, NOW);
        assert_eq!(slices.left(), keys - 200);
        let taken = Taken {
            counters: c.clone(),
            done: vec![(0, done[500..].to_vec())],
            open: Some((0, Arc::new(Mutex::new(Slot::Open(slices))))),
        };
        drop(taken);
        let all = t.drain(NOW);
        assert_eq!(all.len(), keys);
        assert_eq!(all.iter().map(|d| d.value).sum::<f64>(), expected(keys));
    }
}
