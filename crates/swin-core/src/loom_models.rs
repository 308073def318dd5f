//! The counters' concurrent operations under every interleaving loom can make of them
//! (`scripts/loom`: built with `--cfg swin_loom`, where `crate::sync` is loom's). Each
//! model races the operations a node runs at once on one key — increments on the
//! request threads, the sync's drain, a failed push's restore, the store's totals, an
//! eviction, a window's roll — and checks that every hit is counted exactly once and
//! that a read never misses a hit that was counted before it began.

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};
use loom::thread;

use crate::entry::{Added, Entry, Retention, View};

const SIZE: u32 = 60;

/// A fresh entry holding the window starting at 0; the slot's index.
fn entry() -> (Arc<Entry>, usize) {
    let e = Entry::new(0);
    let idx = e.prepare(0, SIZE, &mut |_, _| {}).expect("a fresh slot");
    (Arc::new(e), idx)
}

/// What a final drain takes from the entry, every window.
fn drained(e: &Entry) -> f64 {
    let mut all = 0.0;
    e.drain(&mut |_, d| all += d);
    all
}

/// The exact read of the window starting at `start`: synced and diff.
fn read(e: &Entry, start: i64) -> f64 {
    let (synced, diff) = e.parts_of(start, SIZE, View::Exact);
    synced + diff
}

/// An increment racing the sync's drain and a read: drained once (the drain's figure
/// and what is left add up to the hit), and a read that begins after the hit was
/// counted sees it, in the diff or in `synced` (the read between a drain's diff and its
/// `synced` add).
#[test]
fn an_add_racing_a_drain_and_a_read_is_counted_once_and_seen() {
    loom::model(|| {
        let (e, idx) = entry();
        let added = Arc::new(AtomicBool::new(false));
        let adder = {
            let (e, added) = (e.clone(), added.clone());
            thread::spawn(move || {
                assert_eq!(e.add(idx, 1.0), Added::Counted);
                added.store(true, Ordering::SeqCst);
            })
        };
        let drainer = {
            let e = e.clone();
            thread::spawn(move || drained(&e))
        };
        if added.load(Ordering::SeqCst) {
            assert!(read(&e, 0) >= 1.0, "a counted hit read in neither half");
        }
        adder.join().expect("adder");
        let first = drainer.join().expect("drainer");
        let rest = drained(&e);
        assert_eq!(first + rest, 1.0, "drained exactly once");
        assert_eq!(read(&e, 0), 1.0, "in synced, once");
    });
}

/// Two increments racing a drain (the second may find the first's compare-and-swap in
/// the way and move the key to per-thread stripes): each drained exactly once.
#[test]
fn two_adds_racing_a_drain_are_each_drained_once() {
    loom::model(|| {
        let (e, idx) = entry();
        let adders: Vec<_> = [1.0, 2.0]
            .into_iter()
            .map(|v| {
                let e = e.clone();
                thread::spawn(move || e.add(idx, v))
            })
            .collect();
        let first = drained(&e);
        for a in adders {
            assert_eq!(a.join().expect("adder"), Added::Counted);
        }
        assert_eq!(first + drained(&e), 3.0, "drained exactly once");
        assert_eq!(read(&e, 0), 3.0);
    });
}

/// An eviction racing an increment: the entry is retired only when it holds no diff,
/// and an increment that sees it retired moves what the entry holds to the overflow:
/// the hit is in the entry or in the overflow, exactly once, and never left in a
/// retired (dropped) entry.
#[test]
fn an_eviction_racing_an_add_loses_nothing() {
    loom::model(|| {
        let (e, idx) = entry();
        let overflow = Arc::new(Mutex::new(0.0));
        let adder = {
            let (e, overflow) = (e.clone(), overflow.clone());
            thread::spawn(move || {
                if e.add(idx, 1.0) == Added::Retired {
                    e.flush_retired(&mut |_, d| *overflow.lock().expect("overflow") += d);
                }
            })
        };
        let retired = e.retire(Retention::Synced, 0);
        adder.join().expect("adder");
        let spilled = *overflow.lock().expect("overflow");
        let held = read(&e, 0);
        assert_eq!(spilled + held, 1.0, "counted exactly once");
        assert!(!(retired && held != 0.0), "a hit left in a retired entry");
    });
}

/// A failed push's restore racing an increment: the drained diff comes back beside
/// the new hit, and `synced` loses what the drain had moved there.
#[test]
fn a_restore_racing_an_add_keeps_both() {
    loom::model(|| {
        let (e, idx) = entry();
        assert_eq!(e.add(idx, 2.0), Added::Counted);
        assert_eq!(drained(&e), 2.0);
        let adder = {
            let e = e.clone();
            thread::spawn(move || e.add(idx, 1.0))
        };
        assert!(e.restore(0, SIZE, 2.0), "the window is still held");
        assert_eq!(adder.join().expect("adder"), Added::Counted);
        assert_eq!(e.parts_of(0, SIZE, View::Exact), (0.0, 3.0));
        assert_eq!(drained(&e), 3.0);
    });
}

/// A window's roll (a request of the window two sizes later reuses the slot) racing an
/// increment of the old window: the increment lands in the old window (spilled by the
/// roll) or, when the roll came first, is refused as stale or lands in the new one
/// (the module's known edge) — counted exactly once in any case.
#[test]
fn a_roll_racing_an_add_spills_the_old_window_once() {
    loom::model(|| {
        let (e, idx) = entry();
        let spilled = Arc::new(Mutex::new(0.0));
        let adder = {
            let e = e.clone();
            thread::spawn(move || match e.prepare(0, SIZE, &mut |_, _| {}) {
                Some(i) => {
                    assert_eq!(i, idx);
                    e.add(i, 1.0) == Added::Counted
                }
                None => false,
            })
        };
        let later = 2 * i64::from(SIZE);
        let rolled = {
            let spilled = spilled.clone();
            e.prepare(later, SIZE, &mut |start, d| {
                assert_eq!(start, 0, "the old window spilled");
                *spilled.lock().expect("spilled") += d;
            })
        };
        assert_eq!(rolled, Some(idx));
        let counted = adder.join().expect("adder");
        let spilled = *spilled.lock().expect("spilled");
        let in_new = read(&e, later);
        let total = spilled + in_new;
        assert_eq!(total, if counted { 1.0 } else { 0.0 }, "exactly once");
    });
}

/// A local-only eviction racing an increment that rolls a new window into an expired
/// entry: the entry is retired only when no window that weighs was rolled in before, and
/// an increment that rolled one in after sees it retired (the table counts it again in
/// a new entry) — a hit is never left in a retired entry unseen.
#[test]
fn a_local_only_eviction_racing_a_new_window_leaves_no_hit_unseen() {
    loom::model(|| {
        let (e, _) = entry();
        let later = 2 * i64::from(SIZE);
        let adder = {
            let e = e.clone();
            thread::spawn(move || {
                let i = e
                    .prepare(later, SIZE, &mut |_, _| {})
                    .expect("newer window");
                e.add(i, 1.0)
            })
        };
        // at `later`, the window at 0 no longer weighs (the oldest live starts at SIZE)
        let retired = e.retire(Retention::LocalOnly, i64::from(SIZE));
        // an add that saw the eviction under way asks whether it kept the entry
        let added = adder.join().expect("adder");
        let dead = added == Added::Retired && e.is_retired();
        assert_eq!(retired, dead, "a hit left unseen in a retired entry");
        if !retired {
            assert_eq!(read(&e, later), 1.0);
        }
    });
}

/// Two evictions of one local-only entry (the sync's drain and a table making room, each
/// having found it expired before the increment touched it) racing an increment that
/// rolls a new window in: a hit is never left in an entry an eviction removed (a second
/// retire used to bring the dead entry back, and the increment took it as kept).
#[test]
fn two_local_only_evictions_racing_a_new_window_leave_no_hit_unseen() {
    loom::model(|| {
        let (e, _) = entry();
        let later = 2 * i64::from(SIZE);
        let adder = {
            let e = e.clone();
            thread::spawn(move || {
                let i = e
                    .prepare(later, SIZE, &mut |_, _| {})
                    .expect("newer window");
                e.add(i, 1.0) == Added::Retired && e.is_retired()
            })
        };
        let first = e.retire(Retention::LocalOnly, i64::from(SIZE));
        let second = e.retire(Retention::LocalOnly, i64::from(SIZE));
        let counted_again = adder.join().expect("adder");
        // a true retire means its caller removed the entry from the table
        assert!(
            !(first || second) || counted_again,
            "a hit left in a removed entry: first={first} second={second}"
        );
    });
}

/// Two increments rolling the new window into an expired local-only entry racing one
/// eviction: each counts its hit again (the entry is dead) or is held by the kept entry.
#[test]
fn two_adds_racing_a_local_only_eviction_are_each_held_once() {
    loom::model(|| {
        let (e, _) = entry();
        let later = 2 * i64::from(SIZE);
        let adders: Vec<_> = (0..2)
            .map(|_| {
                let e = e.clone();
                thread::spawn(move || {
                    let i = e
                        .prepare(later, SIZE, &mut |_, _| {})
                        .expect("newer window");
                    e.add(i, 1.0) == Added::Retired && e.is_retired()
                })
            })
            .collect();
        let retired = e.retire(Retention::LocalOnly, i64::from(SIZE));
        let dead: Vec<bool> = adders
            .into_iter()
            .map(|a| a.join().expect("adder"))
            .collect();
        if retired {
            assert!(dead.iter().all(|d| *d), "a hit left in a dead entry");
        } else {
            assert!(dead.iter().all(|d| !*d), "a hit counted again though kept");
            assert_eq!(read(&e, later), 2.0);
        }
    });
}
