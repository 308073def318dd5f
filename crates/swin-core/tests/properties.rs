//! Property tests with an injected clock: conservation of hits under concurrent
//! increments and drains, weights in (0, 1], non-negative rates.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use proptest::prelude::*;
use swin_core::{CounterOptions, Diff, Retention, UnixMs, WindowSize, WindowTable};

fn table(size: u64, max: usize) -> WindowTable {
    WindowTable::new(
        "prop",
        WindowSize::new(size).expect("valid size"),
        CounterOptions {
            retention: Retention::Synced,
            max_counters: max,
        },
    )
}

proptest! {
    #[test]
    fn weight_is_in_zero_one(size in 1u64..=31_622_400, now in -10_000_000_000_000i64..10_000_000_000_000) {
        let w = WindowSize::new(size).expect("valid").previous_weight(UnixMs(now));
        prop_assert!(w > 0.0 && w <= 1.0, "weight {w}");
    }

    #[test]
    fn window_start_contains_now(size in 1u64..=31_622_400, now in -10_000_000_000_000i64..10_000_000_000_000) {
        let s = WindowSize::new(size).expect("valid");
        let start = s.start_of(UnixMs(now));
        prop_assert!(start * 1000 <= now && now < (start + size as i64) * 1000);
        prop_assert_eq!(start.rem_euclid(size as i64), 0);
    }

    #[test]
    fn rate_of_non_negative_input_is_never_negative(
        hits in proptest::collection::vec((0usize..5, 0u32..1000, 0.0f64..1e6), 1..200),
        read_at in 0u32..2000,
    ) {
        let t = table(60, 1000);
        for (k, ms, v) in &hits {
            t.increment(&format!("k{k}"), *v, UnixMs(1_700_000_000_000 + i64::from(*ms) * 100)).expect("finite");
        }
        for k in 0..5 {
            let r = t.rate(&format!("k{k}"), UnixMs(1_700_000_000_000 + i64::from(read_at) * 100), None);
            prop_assert!(r.rate >= 0.0 && r.current >= 0.0 && r.previous >= 0.0);
        }
    }

    #[test]
    fn sequential_hits_equal_drained_plus_left(
        hits in proptest::collection::vec((0usize..20, 0i64..600, -5i64..50), 1..300),
        drain_every in 1usize..50,
    ) {
        let t = table(10, 8);
        let mut drained = 0.0;
        let mut counted = 0.0;
        let mut now = 1_700_000_000_000i64;
        for (i, (k, dt, v)) in hits.iter().enumerate() {
            now += dt * 10;
            let key = format!("k{k}");
            // a decrement takes at most what the window holds (a count stops at zero)
            let held = t.rate(&key, UnixMs(now), None).current;
            let v = (*v as f64).max(-held);
            if t.increment(&key, v, UnixMs(now)).is_ok() {
                counted += v;
            }
            if i % drain_every == 0 {
                drained += t.drain(UnixMs(now)).iter().map(|d| d.value).sum::<f64>();
            }
            prop_assert!(t.len() <= 8);
        }
        drained += t.drain(UnixMs(now)).iter().map(|d| d.value).sum::<f64>();
        prop_assert_eq!(drained, counted);
    }
}

/// Several threads increment integers while another drains, restores every other batch
/// (as after a failed push) and drains again: every hit is counted exactly once.
fn concurrent_conservation(threads: usize, keys: usize, per_thread: usize, size: u64, cap: usize) {
    let t = table(size, cap);
    let done = AtomicBool::new(false);
    let drained = Mutex::new(0.0f64);
    let counted = Mutex::new(0.0f64);
    std::thread::scope(|s| {
        let drainer = s.spawn(|| {
            let mut round = 0i64;
            while !done.load(Ordering::Acquire) {
                let batch: Vec<Diff> = t.drain(UnixMs(1_700_000_000_000 + round * 5));
                if round % 2 == 0 {
                    t.restore(batch);
                } else {
                    *drained.lock().expect("lock") += batch.iter().map(|d| d.value).sum::<f64>();
                }
                round += 1;
                std::thread::yield_now();
            }
        });
        let workers: Vec<_> = (0..threads)
            .map(|th| {
                let (t, counted) = (&t, &counted);
                s.spawn(move || {
                    let mut mine = 0.0;
                    let mut now = 1_700_000_000_000i64;
                    for i in 0..per_thread {
                        now += (i % 7) as i64 * 3; // windows roll while we go
                        let key = format!("k{}", (i * 31 + th * 7) % keys);
                        let v = ((i % 5) + 1) as f64;
                        if t.increment(&key, v, UnixMs(now)).is_ok() {
                            mine += v;
                        }
                    }
                    *counted.lock().expect("lock") += mine;
                })
            })
            .collect();
        for w in workers {
            w.join().expect("incrementer");
        }
        done.store(true, Ordering::Release);
        drainer.join().expect("drainer");
    });
    let left: f64 = t.drain(UnixMs(i64::MAX / 4)).iter().map(|d| d.value).sum();
    let drained = *drained.lock().expect("lock");
    let counted = *counted.lock().expect("lock");
    assert!(counted > 0.0);
    assert_eq!(
        drained + left,
        counted,
        "drained {drained} + left {left} != counted {counted}"
    );
}

#[test]
fn concurrent_hot_key_increments_and_drains_conserve_hits() {
    concurrent_conservation(4, 1, 50_000, 1, 1000);
}

#[test]
fn concurrent_many_keys_with_eviction_conserve_hits() {
    concurrent_conservation(4, 500, 30_000, 1, 64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn concurrent_conservation_holds_for_any_shape(
        threads in 2usize..5, keys in 1usize..50, size in 1u64..3, cap in 4usize..64,
    ) {
        concurrent_conservation(threads, keys, 5_000, size, cap);
    }
}

proptest! {
    /// GCRA never admits more than `burst + elapsed / emission_interval` cost in any
    /// interval (Boulder's bound), whatever the arrival pattern and costs.
    #[test]
    fn gcra_never_admits_more_than_burst_plus_refill(
        burst in 1i64..20,
        count in 1i64..20,
        period_ms in 1u64..5_000,
        steps in proptest::collection::vec((0i64..2_000, 0i64..20), 1..200),
    ) {
        use swin_core::Gcra;
        let g = Gcra::new(burst, count, std::time::Duration::from_millis(period_ms)).expect("valid");
        let ei = g.emission_interval().as_nanos() as f64;
        let mut now = 1_700_000_000_000_000_000i64;
        let mut tat = None;
        let mut admitted: Vec<(i64, i64)> = Vec::new();
        for (gap_ms, cost) in steps {
            now += gap_ms * 1_000_000;
            let cost = cost.min(burst);
            let d = g.spend(tat, now, cost).expect("cost within burst");
            if d.decision.allowed {
                prop_assert_eq!(d.decision.retry_after, std::time::Duration::ZERO);
                tat = Some(d.new_tat);
                admitted.push((now, cost));
            } else {
                // waiting retry_after is enough, and not a nanosecond more than needed
                let wait = d.decision.retry_after.as_nanos() as i64;
                prop_assert!(g.spend(tat, now + wait, cost).expect("cost").decision.allowed);
                prop_assert!(!g.spend(tat, now + wait - 1, cost).expect("cost").decision.allowed);
            }
        }
        // every interval [a, b] between admissions
        for i in 0..admitted.len() {
            let mut sum = 0;
            for j in i..admitted.len() {
                sum += admitted[j].1;
                let elapsed = (admitted[j].0 - admitted[i].0) as f64;
                prop_assert!(
                    sum as f64 <= burst as f64 + elapsed / ei + 1e-9,
                    "admitted {sum} in {elapsed} ns, bound {}", burst as f64 + elapsed / ei
                );
            }
        }
    }
}

proptest! {
    /// After waiting `retry_after`, the same hit is allowed (no other hits meanwhile), and
    /// an allowed sliding-window hit never takes the rate above the limit.
    #[test]
    fn sliding_retry_after_is_enough(
        limit in 1u32..100,
        current in 0u32..200,
        previous in 0u32..200,
        into_ms in 0i64..60_000,
        cost in 1u32..5,
    ) {
        use swin_core::{WindowAlgorithm, WindowLimit};
        let size = WindowSize::new(60).expect("size");
        let l = WindowLimit::new(size, f64::from(limit), WindowAlgorithm::Sliding).expect("limit");
        let cost = f64::from(cost.min(limit));
        let now = UnixMs(1_763_784_000_000 + into_ms);
        let (cur, prev) = (f64::from(current), f64::from(previous));
        let d = l.decide(cur, prev, now, cost).expect("cost");
        if d.allowed {
            let rate = cur + prev * size.previous_weight(now);
            prop_assert!(rate + cost <= f64::from(limit));
        } else {
            let later = UnixMs(now.0 + d.retry_after.as_millis() as i64);
            // counts as the table would hold them then
            let (c, p) = if size.start_of(later) == size.start_of(now) {
                (cur, prev)
            } else if size.start_of(later) == size.start_of(now) + 60 {
                (0.0, cur)
            } else {
                (0.0, 0.0)
            };
            let again = l.decide(c, p, later, cost).expect("cost");
            prop_assert!(again.allowed, "{d:?} then {again:?}");
        }
    }
}
