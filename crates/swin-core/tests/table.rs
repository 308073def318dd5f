//! Behaviour of the counter table through its public API, with an injected clock.

use swin_core::{
    CoreError, CounterOptions, Diff, NamespaceCounters, Retention, Total, UnixMs, WindowSize,
    WindowTable,
};

const T0: i64 = 1_763_784_000; // a minute boundary

fn at(secs: i64) -> UnixMs {
    UnixMs::from_secs(T0 + secs)
}

fn table(size: u64, max: usize, retention: Retention) -> WindowTable {
    WindowTable::new(
        "test",
        WindowSize::new(size).expect("valid size"),
        CounterOptions {
            retention,
            max_counters: max,
        },
    )
}

fn sum(diffs: &[Diff]) -> f64 {
    diffs.iter().map(|d| d.value).sum()
}

#[test]
fn seed_example_through_the_table() {
    let t = table(60, 100, Retention::Synced);
    t.increment("k", 40.0, at(-1)).expect("finite");
    let r = t.increment("k", 10.0, at(30)).expect("finite");
    assert_eq!((r.current, r.previous, r.rate), (10.0, 40.0, 30.0));
    assert_eq!(r.window_start, T0);
    assert_eq!(r.window_size, 60);
}

#[test]
fn rate_reads_without_counting_and_takes_an_override() {
    let t = table(60, 100, Retention::Synced);
    t.increment("k", 20.0, at(-30)).expect("finite");
    t.increment("k", 10.0, at(10)).expect("finite");
    assert_eq!(t.rate("k", at(30), None).rate, 20.0);
    assert_eq!(t.rate("k", at(30), None).rate, 20.0);
    assert_eq!(t.rate("k", at(30), Some(2.0)).rate, 12.0);
    assert_eq!(t.rate("absent", at(30), None).rate, 0.0);
}

#[test]
fn fractional_and_negative_values() {
    let t = table(1, 100, Retention::Synced);
    t.increment("k", 0.25, at(0)).expect("finite");
    let r = t.increment("k", -0.125, at(0)).expect("finite");
    assert_eq!(r.current, 0.125);
    // past zero it stops at zero, as every store does
    let r = t.increment("k", -1.0, at(0)).expect("finite");
    assert_eq!(r.current, 0.0);
}

#[test]
fn non_finite_values_are_rejected() {
    let t = table(1, 100, Retention::Synced);
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(matches!(
            t.increment("k", v, at(0)),
            Err(CoreError::NonFiniteValue(_))
        ));
    }
    assert!(t.is_empty());
}

#[test]
fn drain_moves_diffs_into_synced_and_restore_puts_them_back() {
    let t = table(60, 100, Retention::Synced);
    t.increment("a", 3.0, at(1)).expect("finite");
    t.increment("b", 2.0, at(1)).expect("finite");
    let drained = t.drain(at(2));
    assert_eq!(drained.len(), 2);
    assert_eq!(sum(&drained), 5.0);
    // the view does not dip while the push is in flight
    assert_eq!(t.rate("a", at(2), None).current, 3.0);
    assert!(t.drain(at(2)).is_empty());
    t.restore(drained);
    assert_eq!(t.rate("a", at(2), None).current, 3.0);
    let again = t.drain(at(3));
    assert_eq!(sum(&again), 5.0);
}

#[test]
fn apply_overwrites_synced_and_keeps_local_diff() {
    let t = table(60, 100, Retention::Synced);
    t.increment("foo", 3.0, at(1)).expect("finite");
    let drained = t.drain(at(1));
    assert_eq!(sum(&drained), 3.0);
    // the store was seeded with 3; after the push it holds 6
    t.apply(
        &[Total {
            key: "foo".into(),
            window_size: 60,
            window_start: T0,
            count: 6.0,
        }],
        at(1),
        false,
    );
    assert_eq!(t.rate("foo", at(1), None).current, 6.0);
    assert_eq!(t.rate("foo", at(1), Some(0.0)).current, 6.0); // local diff is 0
    t.increment("foo", 1.0, at(2)).expect("finite");
    assert_eq!(t.rate("foo", at(2), None).current, 7.0);
}

#[test]
fn apply_with_create_warms_up_unknown_keys() {
    let t = table(60, 100, Retention::Synced);
    let totals = [
        Total {
            key: "x".into(),
            window_size: 60,
            window_start: T0,
            count: 4.0,
        },
        Total {
            key: "x".into(),
            window_size: 60,
            window_start: T0 - 60,
            count: 8.0,
        },
        Total {
            key: "old".into(),
            window_size: 60,
            window_start: T0 - 600,
            count: 8.0,
        },
    ];
    t.apply(&totals, at(30), false);
    assert!(!t.contains("x"));
    t.apply(&totals, at(30), true);
    assert_eq!(t.rate("x", at(30), None).rate, 8.0);
    assert!(!t.contains("old"));
}

#[test]
fn rolled_over_diffs_are_kept_until_drained() {
    let t = table(1, 100, Retention::Synced);
    t.increment("k", 1.0, at(0)).expect("finite");
    t.increment("k", 2.0, at(1)).expect("finite");
    t.increment("k", 4.0, at(2)).expect("finite"); // reuses the slot of window 0
    let drained = t.drain(at(2));
    assert_eq!(sum(&drained), 7.0);
    let mut starts: Vec<i64> = drained.iter().map(|d| d.window_start - T0).collect();
    starts.sort();
    assert_eq!(starts, vec![0, 1, 2]);
}

/// A window that rolled out of its entry and was counted again from a clock windows
/// behind is spilled twice: the drain answers it once, summed (a store's statement may
/// touch a row once; the sync no longer sorts and sums a whole drain).
#[test]
fn a_window_spilled_twice_drains_once() {
    let t = table(1, 100, Retention::Synced);
    t.increment("k", 1.0, at(0)).expect("finite");
    t.increment("k", 2.0, at(1)).expect("finite");
    t.increment("k", 4.0, at(2)).expect("finite"); // window 0 spilled
    t.increment("k", 8.0, at(0)).expect("finite"); // a clock behind: window 0 spilled again
    let mut drained: Vec<(i64, f64)> = t
        .drain(at(2))
        .iter()
        .map(|d| (d.window_start - T0, d.value))
        .collect();
    drained.sort_by_key(|d| d.0);
    assert_eq!(drained, vec![(0, 9.0), (1, 2.0), (2, 4.0)]);
}

/// A drain taken a few keys at a time takes what one walk takes, windows that rolled
/// over included, each once; keys added meanwhile wait for the next drain.
#[test]
fn a_drain_in_slices_takes_what_one_walk_takes() {
    let (whole, sliced) = (
        table(1, 10_000, Retention::Synced),
        table(1, 10_000, Retention::Synced),
    );
    for t in [&whole, &sliced] {
        for i in 0..1_000 {
            let key = format!("k{i}");
            t.increment(&key, 1.0, at(0)).expect("finite");
            if i % 3 == 0 {
                t.increment(&key, 2.0, at(1)).expect("finite");
                t.increment(&key, 4.0, at(2)).expect("finite"); // window 0 spilled
            }
        }
    }
    let mut slices = sliced.drain_in_slices();
    let mut calls = 1;
    while sliced.drain_slice(&mut slices, 7, at(2)) {
        calls += 1;
        if calls == 2 {
            sliced.increment("late", 1.0, at(2)).expect("finite");
        }
    }
    assert_eq!((calls, slices.left()), (143, 0));
    let key = |d: &Diff| (d.key.to_string(), d.window_start, d.value.to_bits());
    let mut a: Vec<_> = whole.drain(at(2)).iter().map(key).collect();
    let mut b: Vec<_> = slices.finish().iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(a.len(), 1_000 + 2 * 334);
    assert_eq!(a, b);
    // the key added mid-drain, then nothing else
    let next = sliced.drain(at(2));
    assert_eq!((next.len(), sum(&next)), (1, 1.0));
}

/// A key's windows come out of a drain together, the ones drained from its entry first
/// and a window that rolled over after them: the sync pushes a drain in chunks and reads
/// beside each chunk the current and previous windows of its keys that the chunk (or the
/// next) does not push.
#[test]
fn a_keys_windows_drain_together() {
    let t = table(1, 10_000, Retention::Synced);
    for i in 0..500 {
        t.increment(&format!("other{i}"), 1.0, at(2))
            .expect("finite");
    }
    for i in 0..10 {
        let key = format!("k{i}");
        t.increment(&key, 1.0, at(0)).expect("finite");
        t.increment(&key, 2.0, at(1)).expect("finite");
        t.increment(&key, 4.0, at(2)).expect("finite"); // window 0 spilled
    }
    let drained = t.drain(at(2));
    for i in 0..10 {
        let key = format!("k{i}");
        let at: Vec<usize> = (0..drained.len())
            .filter(|&j| drained[j].key == key.as_str())
            .collect();
        assert_eq!(at.len(), 3, "{key}");
        assert_eq!(at[2] - at[0], 2, "{key}'s windows apart: {at:?}");
        // the entry's windows (the ones a sync reads) first, the rolled-over one after:
        // a run longer than a push's chunk starts with what the chunk would read
        let starts: Vec<i64> = at.iter().map(|&j| drained[j].window_start - T0).collect();
        assert_eq!(starts[2], 0, "{key}: {starts:?}");
    }
}

/// A table found full while a drain in slices is under way is scanned again once the
/// drain ends: a new key does not wait for the next drain (nor does a full table scan
/// again on every slice).
#[test]
fn a_drain_in_slices_makes_room_when_it_ends() {
    let t = table(60, 10, Retention::Synced);
    for i in 0..10 {
        t.increment(&format!("k{i}"), 1.0, at(0)).expect("finite");
    }
    let mut slices = t.drain_in_slices();
    assert!(
        matches!(
            t.increment("x", 1.0, at(0)),
            Err(CoreError::CapacityExceeded { .. })
        ),
        "nothing drained yet: every entry holds hits"
    );
    while t.drain_slice(&mut slices, 5, at(0)) {}
    t.increment("y", 1.0, at(0))
        .expect("room made by the drain");
    assert_eq!(sum(&slices.finish()), 10.0);
}

#[test]
fn local_only_forgets_expired_windows() {
    let t = table(1, 100, Retention::LocalOnly);
    t.increment("k", 1.0, at(0)).expect("finite");
    t.increment("k", 1.0, at(5)).expect("finite");
    assert_eq!(t.rate("k", at(5), None).current, 1.0);
}

#[test]
fn expired_entries_are_dropped_once_drained() {
    let t = table(1, 100, Retention::Synced);
    t.increment("k", 1.0, at(0)).expect("finite");
    assert_eq!(t.drain(at(0)).len(), 1);
    assert_eq!(t.len(), 1);
    assert!(t.drain(at(10)).is_empty());
    assert_eq!(t.len(), 0);
}

#[test]
fn the_cap_evicts_least_recently_used_synced_keys() {
    let t = table(60, 10, Retention::Synced);
    for i in 0..10 {
        t.increment(&format!("k{i}"), 1.0, at(i)).expect("room");
    }
    // every key has an unsynced diff: nothing may be evicted (and, until the next
    // drain, a new key is refused without another scan)
    for key in ["new", "other"] {
        assert!(matches!(
            t.increment(key, 1.0, at(20)),
            Err(CoreError::CapacityExceeded { .. })
        ));
    }
    assert_eq!(t.evictions(), 0);
    t.drain(at(20));
    t.rate("k0", at(21), None); // k0 is used again: k1 is now the oldest
    t.increment("new", 1.0, at(22))
        .expect("room after eviction");
    assert!(t.evictions() >= 1);
    assert!(t.contains("k0"));
    assert!(!t.contains("k1"));
    assert!(t.len() <= 10);
}

/// In a local-only namespace the table is the only record of a key's hits: a full table
/// evicts only keys whose windows no longer weigh (a key at its limit whose previous
/// window still counts is kept, and a new key waits for room instead).
#[test]
fn a_full_local_only_table_keeps_keys_whose_previous_window_weighs() {
    let t = table(60, 10, Retention::LocalOnly);
    t.increment("k0", 5.0, at(59)).expect("room");
    t.drain(at(59));
    let mut refused = 0;
    for i in 0..20 {
        // at the minute's turn, other keys churn (each drained, as the local loop does)
        match t.increment(&format!("churn-{i}"), 1.0, at(61)) {
            Ok(_) => {}
            Err(CoreError::CapacityExceeded { .. }) => refused += 1,
            Err(e) => panic!("unexpected {e}"),
        }
        t.drain(at(61));
    }
    assert!(refused > 0, "a full table of live keys refuses a new key");
    let r = t.rate("k0", at(62), None);
    assert_eq!(r.previous, 5.0, "k0's previous window still weighs");
    // once their windows no longer weigh, keys make room again
    t.drain(at(180));
    t.increment("late", 1.0, at(180))
        .expect("room once the churned keys' windows passed");
}

#[test]
fn a_flood_of_distinct_keys_stays_under_the_cap() {
    let t = table(60, 1000, Retention::Synced);
    for i in 0..20_000 {
        match t.increment(&format!("flood-{i}"), 1.0, at(1)) {
            Ok(_) => {}
            Err(CoreError::CapacityExceeded { .. }) => {
                let d = t.drain(at(1));
                assert!(!d.is_empty());
            }
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(t.len() <= 1000);
    }
    assert!(t.evictions() > 10_000);
}

#[test]
fn a_namespace_routes_by_window_size() {
    let sizes = [
        WindowSize::new(60).expect("valid"),
        WindowSize::new(1).expect("valid"),
        WindowSize::new(60).expect("valid"),
    ];
    let ns = NamespaceCounters::new("api", &sizes, CounterOptions::default());
    assert_eq!(ns.name(), "api");
    assert_eq!(
        ns.window_sizes().map(|s| s.secs()).collect::<Vec<_>>(),
        vec![1, 60]
    );
    let r = ns.increment("k", 60, 2.0, at(0)).expect("known");
    assert_eq!(r.current, 2.0);
    assert!(matches!(
        ns.increment("k", 30, 1.0, at(0)),
        Err(CoreError::UnknownWindowSize {
            window_size: 30,
            ..
        })
    ));
    assert_eq!(ns.len(), 1);
}

#[test]
fn a_tracked_read_adds_the_key_for_the_next_sync() {
    let t = table(60, 100, Retention::Synced);
    assert_eq!(t.rate_tracked("seen-elsewhere", at(1)).rate, 0.0);
    assert!(t.contains("seen-elsewhere"));
    assert_eq!(t.keys(), vec!["seen-elsewhere"]);
    assert!(t.drain(at(1)).is_empty());
}

#[test]
fn totals_reach_a_key_that_was_only_read() {
    let t = table(3600, 100, Retention::Synced);
    let now = UnixMs(1_795_328_680_193);
    assert_eq!(t.rate_tracked("k", now).current, 0.0);
    let start = WindowSize::new(3600).expect("size").start_of(now);
    t.apply(
        &[Total {
            key: "k".into(),
            window_size: 3600,
            window_start: start,
            count: 10.0,
        }],
        now,
        false,
    );
    assert_eq!(t.rate("k", now, None).current, 10.0);
}

/// A count stays below 2^53: the hit that would reach it is refused and counts nothing
/// (at 2^53 − 1, +1 made 2^53 and +1 more was absorbed by rounding, answered 200).
#[test]
fn a_hit_that_would_reach_2_pow_53_is_refused() {
    let t = table(60, 10, Retention::Synced);
    let now = at(20);
    let below = swin_core::MAX_COUNT - 1.0;
    t.increment("k", below, now).expect("below the bound");
    let e = t.increment("k", 1.0, now).expect_err("reaches 2^53");
    assert!(matches!(e, CoreError::CountOutOfRange { .. }), "{e:?}");
    assert_eq!(t.rate("k", now, None).current, below, "nothing counted");
    t.increment("k", -1.0, now).expect("down is fine");
    assert_eq!(t.rate("k", now, None).current, below - 1.0);
}

/// A decrement past zero stops at zero, as in every store: the node neither answers a
/// negative count nor admits hits past a limit on the strength of one.
#[test]
fn a_decrement_past_zero_stops_at_zero() {
    let t = table(60, 10, Retention::Synced);
    let now = at(20);
    t.increment("k", 7.0, now).expect("count");
    let r = t.increment("k", -100.0, now).expect("decrement");
    assert_eq!((r.current, r.rate), (0.0, 0.0));
    let r = t.increment("k", 3.0, now).expect("count");
    assert_eq!(
        r.current, 3.0,
        "what came after the decrement counts from zero"
    );
    let pushed: f64 = t.drain(now).iter().map(|d| d.value).sum();
    assert_eq!(pushed, 3.0, "7 − 7 + 3: the store ends where the node is");
}

/// A read racing a drain must never miss a hit: never see it in neither half (the diff
/// already taken, `synced` not yet raised), which would admit that many hits past a
/// limit. For a moment it may see the hit being drained twice (`synced` raised, the diff
/// not yet zeroed): one drain's worth at most, here 1.
#[test]
fn a_read_racing_a_drain_never_misses_a_hit() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let t = Arc::new(table(60, 100, Retention::Synced));
    let counted = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (t, counted, done) = (t.clone(), counted.clone(), done.clone());
        std::thread::spawn(move || {
            for _ in 0..300_000 {
                t.increment("k", 1.0, at(1)).expect("finite");
                counted.fetch_add(1, Ordering::SeqCst);
                t.drain(at(1));
            }
            done.store(true, Ordering::SeqCst);
        })
    };
    let mut wrong = Vec::new();
    while !done.load(Ordering::SeqCst) {
        let before = counted.load(Ordering::SeqCst) as f64;
        let read = t.rate("k", at(1), None).current;
        // at most one increment on its way while the read ran, and one drain's 1 twice
        let after = counted.load(Ordering::SeqCst) as f64 + 2.0;
        if read < before || read > after {
            wrong.push((before, read, after));
        }
    }
    writer.join().expect("writer");
    assert_eq!(t.rate("k", at(1), None).current, 300_000.0);
    assert!(
        wrong.is_empty(),
        "{} reads off, first (before, read, after) {:?}",
        wrong.len(),
        wrong.first()
    );
}
