use super::*;
use std::time::Duration;

const NOW: i64 = 1_763_784_000_000_000_000;
const SEC: i64 = 1_000_000_000;

fn gcra() -> Gcra {
    // 10 per 10 s, burst 10: one token a second
    Gcra::new(10, 10, Duration::from_secs(10)).expect("gcra")
}

#[test]
fn spends_until_empty_and_records_the_advances() {
    let t = BucketTable::new("ns", 100, Retention::Synced);
    let g = gcra();
    for _ in 0..10 {
        assert!(t.spend(&g, "k", NOW, 1, false).expect("spend").allowed);
    }
    let d = t.spend(&g, "k", NOW, 1, false).expect("spend");
    assert!(!d.allowed);
    assert_eq!(d.retry_after, Duration::from_secs(1));
    assert_eq!(t.tat("k"), Some(NOW + 10 * SEC));
    assert_eq!(
        t.drain(NOW),
        vec![Advance {
            key: "k".into(),
            ns: 10 * SEC
        }]
    );
    assert!(t.drain(NOW).is_empty());
}

#[test]
fn forced_spends_move_the_tat_when_denied() {
    let t = BucketTable::new("ns", 100, Retention::Synced);
    let g = gcra();
    for _ in 0..12 {
        t.spend(&g, "k", NOW, 1, true).expect("spend");
    }
    assert_eq!(t.tat("k"), Some(NOW + 12 * SEC));
}

#[test]
fn cluster_tats_and_own_spends_combine() {
    let t = BucketTable::new("ns", 100, Retention::Synced);
    let g = gcra();
    t.spend(&g, "k", NOW, 2, false).expect("spend");
    let drained = t.drain(NOW);
    assert_eq!(drained[0].ns, 2 * SEC);
    // spent again after the drain; the store says others spent 5 more
    t.spend(&g, "k", NOW, 1, false).expect("spend");
    t.apply(
        &[Tat {
            key: "k".into(),
            tat_ns: NOW + 7 * SEC,
        }],
        false,
    );
    assert_eq!(t.tat("k"), Some(NOW + 8 * SEC));
    // an older answer never moves it back
    t.apply(
        &[Tat {
            key: "k".into(),
            tat_ns: NOW,
        }],
        false,
    );
    assert_eq!(t.tat("k"), Some(NOW + 8 * SEC));
}

#[test]
fn a_full_table_evicts_the_buckets_that_refill_soonest() {
    let t = BucketTable::new("ns", 10, Retention::Synced);
    let g = gcra();
    // ten keys spend their whole burst a tenth of a second apart: k0 refills first
    for i in 0..10 {
        let at = NOW + i * SEC / 10;
        let d = t.spend(&g, &format!("k{i}"), at, 10, false).expect("spend");
        assert!(d.allowed);
    }
    // every bucket has advances not yet pushed: nothing may go, and saying so
    // again costs no scan until the next drain
    for _ in 0..2 {
        assert!(matches!(
            t.spend(&g, "new", NOW + SEC, 1, false),
            Err(CoreError::BucketsFull { .. })
        ));
    }
    t.drain(NOW + SEC);
    // none is full yet, but a new key gets room: down to 90 % of the cap, the two
    // that refill soonest go
    assert!(
        t.spend(&g, "new", NOW + SEC, 1, false)
            .expect("spend")
            .allowed
    );
    assert_eq!(t.len(), 9);
    assert_eq!(t.tat("k0"), None);
    assert_eq!(t.tat("k1"), None);
    assert!(t.tat("k2").is_some() && t.tat("k9").is_some());
}

#[test]
fn full_idle_buckets_are_dropped_and_the_cap_holds() {
    let t = BucketTable::new("ns", 2, Retention::Synced);
    let g = gcra();
    t.spend(&g, "a", NOW, 1, false).expect("spend");
    t.spend(&g, "b", NOW, 1, false).expect("spend");
    assert!(matches!(
        t.spend(&g, "c", NOW, 1, false),
        Err(CoreError::BucketsFull { .. })
    ));
    t.drain(NOW);
    // a second later both are full again and nothing is pending: room for c
    let later = NOW + SEC;
    assert!(t.spend(&g, "c", later, 1, false).expect("spend").allowed);
    t.drain(later);
    assert_eq!(t.len(), 1);
}

#[test]
fn restore_puts_advances_back_and_refund_takes_one_back() {
    let t = BucketTable::new("ns", 100, Retention::Synced);
    let g = gcra();
    t.spend(&g, "k", NOW, 3, false).expect("spend");
    let d = t.drain(NOW);
    t.restore(&d);
    assert_eq!(t.drain(NOW), d);
    assert!(t.refund(&g, "k", NOW, 1).expect("refund").allowed);
    assert_eq!(t.tat("k"), Some(NOW + 2 * SEC));
    assert_eq!(t.drain(NOW)[0].ns, -SEC);
}

#[test]
fn concurrent_spends_never_exceed_the_burst() {
    let t = Arc::new(BucketTable::new("ns", 100, Retention::Synced));
    let g = gcra();
    let allowed: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                let t = t.clone();
                s.spawn(move || {
                    (0..100)
                        .filter(|_| t.spend(&g, "k", NOW, 1, false).expect("spend").allowed)
                        .count()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("join")).sum()
    });
    assert_eq!(allowed, 10);
    assert_eq!(t.drain(NOW)[0].ns, 10 * SEC);
}

/// Local-only: the table is a key's only record, so a full table evicts only full
/// buckets; a key at its limit is not evicted by other keys' churn (it used to start
/// full again, its burst spent twice), and a new key waits while every bucket refills.
#[test]
fn a_full_local_only_table_evicts_only_full_buckets() {
    let t = BucketTable::new("ns", 2, Retention::LocalOnly);
    let g = gcra();
    for _ in 0..10 {
        assert!(t.spend(&g, "victim", NOW, 1, false).expect("spend").allowed);
    }
    assert!(!t.spend(&g, "victim", NOW, 1, false).expect("spend").allowed);
    t.drain(NOW);
    // other keys spend their whole burst a moment later: their buckets are further
    // from full than the victim's
    let soon = NOW + SEC / 10;
    for i in 0..5 {
        let churn = format!("churn-{i}");
        for _ in 0..10 {
            let _ = t.spend(&g, &churn, soon, 1, false);
        }
        t.drain(soon);
    }
    assert!(
        !t.spend(&g, "victim", soon, 1, false)
            .expect("spend")
            .allowed,
        "the victim's empty bucket was kept"
    );
    // once it has refilled it may go
    let later = NOW + 20 * SEC;
    t.drain(later);
    assert!(t.spend(&g, "late", later, 1, false).expect("spend").allowed);
}
