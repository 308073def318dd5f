//! GCRA buckets: TAT advances, buckets shared between engines, the synchronous burst.

use super::*;

/// The store applies advances as `tat = max(tat, now) + Σ advances`, once per seq.
pub(super) async fn tat_advances_apply_max_then_add(s: &TestStore) {
    let st = &s.store;
    let got = st
        .push_tats(
            "g",
            tat_push(Some(1), NOW_NS, &[adv("k", 4), adv("k", 6), adv("j", 1)]),
        )
        .await
        .expect("push");
    let mut got: Vec<_> = got
        .into_iter()
        .map(|t| (t.key.to_string(), t.tat_ns))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![("j".into(), NOW_NS + SEC), ("k".into(), NOW_NS + 10 * SEC)]
    );
    // later but before the TAT: added to the TAT
    st.push_tats("g", tat_push(Some(2), NOW_NS + SEC, &[adv("k", 5)]))
        .await
        .expect("push");
    assert_eq!(tat_of(st, "g", "k").await, Some(NOW_NS + 15 * SEC));
    // a retry of seq 2 changes nothing and answers with the TAT
    let again = st
        .push_tats("g", tat_push(Some(2), NOW_NS + SEC, &[adv("k", 5)]))
        .await
        .expect("retry");
    assert_eq!(again[0].tat_ns, NOW_NS + 15 * SEC);
    // after the TAT passed: from now
    st.push_tats("g", tat_push(None, NOW_NS + 100 * SEC, &[adv("k", 2)]))
        .await
        .expect("push");
    assert_eq!(tat_of(st, "g", "k").await, Some(NOW_NS + 102 * SEC));
    // a refund is a negative advance
    st.push_tats("g", tat_push(None, NOW_NS + 100 * SEC, &[adv("k", -1)]))
        .await
        .expect("refund");
    assert_eq!(tat_of(st, "g", "k").await, Some(NOW_NS + 101 * SEC));
    // warm-up sees buckets that are not full; other namespaces are apart
    let live = st.load_tats("g", NOW_NS + 50 * SEC).await.expect("load");
    assert_eq!(live.len(), 1, "{live:?}");
    assert_eq!(tat_of(st, "other", "k").await, None);
    // a reset deletes the key's bucket and counters
    st.push("g", push(&PushId::from("n1"), 3, &[diff("k", CUR, 3.0)]))
        .await
        .expect("push counts");
    st.reset("g", "k", &[60]).await.expect("reset");
    assert_eq!(tat_of(st, "g", "k").await, None);
    assert!(totals(st, "g", &[wk("k", CUR)]).await.is_empty());
    // a retry of a push applied before the reset is still recognised (its reply was
    // lost): the reset is not undone
    st.push("g", push(&PushId::from("n1"), 3, &[diff("k", CUR, 3.0)]))
        .await
        .expect("retry after the reset");
    st.push_tats("g", tat_push(Some(2), NOW_NS + SEC, &[adv("k", 5)]))
        .await
        .expect("retry after the reset");
    assert_eq!(
        totals(st, "g", &[wk("k", CUR)])
            .await
            .iter()
            .map(|t| t.2)
            .sum::<f64>(),
        0.0
    );
    assert!(tat_of(st, "g", "k").await.is_none_or(|t| t <= NOW_NS + SEC));
    assert_eq!(tat_of(st, "g", "j").await, Some(NOW_NS + SEC));
}

pub(super) fn gcra_engine(store: &Store, mode: SyncMode) -> Arc<NamespaceSync> {
    let counters = Arc::new(NamespaceCounters::new("g", &[], CounterOptions::default()));
    Arc::new(
        NamespaceSync::new(
            counters,
            mode,
            Some(store.clone()),
            swin_sync::new_node_id().into(),
            Duration::from_secs(5),
        )
        .with_buckets(),
    )
}

pub(super) fn ten_per_ten_secs() -> Gcra {
    Gcra::new(10, 10, Duration::from_secs(10)).expect("gcra")
}

/// Two periodic nodes share one bucket: after syncs both hold every spend, and a node
/// that starts warms up with it. Failed pushes lose and double nothing.
pub(super) async fn gcra_buckets_are_shared(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let a = gcra_engine(&faulty, SyncMode::Periodic(Duration::from_millis(100)));
    let b = gcra_engine(&s.store, SyncMode::Periodic(Duration::from_millis(100)));
    let g = ten_per_ten_secs();
    let now = UnixMs(NOW * 1000);
    for _ in 0..3 {
        assert!(a.spend(&g, "k", 1, now, false).await.expect("a").allowed);
    }
    control.plan([Fault::FailAfter]);
    assert!(a.sync_once(now).await.is_err());
    for _ in 0..3 {
        assert!(a.spend(&g, "k", 1, now, false).await.expect("a").allowed);
    }
    for _ in 0..2 {
        assert!(b.spend(&g, "k", 1, now, false).await.expect("b").allowed);
    }
    a.sync_once(now).await.expect("retry");
    a.sync_once(now).await.expect("fresh advances");
    b.sync_once(now).await.expect("b");
    a.sync_once(now).await.expect("a reads b");
    assert_eq!(tat_of(&s.store, "g", "k").await, Some(NOW_NS + 8 * SEC));
    for e in [&a, &b] {
        assert_eq!(e.counters().buckets().tat("k"), Some(NOW_NS + 8 * SEC));
        let d = e.dry_run(&g, "k", 3, now).await.expect("dry run");
        assert!(!d.allowed, "8 of 10 spent, 3 more do not fit");
        assert_eq!(d.remaining, 2.0);
    }
    let c = gcra_engine(&s.store, SyncMode::Periodic(Duration::from_millis(100)));
    assert_eq!(c.warm_up(now).await.expect("warm up"), 1);
    assert_eq!(c.counters().buckets().tat("k"), Some(NOW_NS + 8 * SEC));
}

/// Synchronous GCRA across two nodes admits exactly the burst, even concurrently.
pub(super) async fn gcra_synchronous_admits_exactly_the_burst(s: &TestStore) {
    let a = gcra_engine(&s.store, SyncMode::Synchronous);
    let b = gcra_engine(&s.store, SyncMode::Synchronous);
    let now = UnixMs(NOW * 1000);
    let mut tasks = Vec::new();
    for i in 0..30 {
        let e = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            e.spend(&ten_per_ten_secs(), "k", 1, now, false)
                .await
                .expect("spend")
                .allowed
        }));
    }
    let mut allowed = 0;
    for t in tasks {
        allowed += usize::from(t.await.expect("task"));
    }
    assert!(allowed <= 10, "admitted {allowed}");
    // denied spends were taken back: the TAT holds only the admitted ones
    assert_eq!(
        tat_of(&s.store, "g", "k").await,
        Some(NOW_NS + allowed as i64 * SEC)
    );
    // (racing spends may both be denied, never both allowed): the rest of the burst
    // is still there, one at a time
    while allowed < 11 {
        let e = if allowed % 2 == 0 { &a } else { &b };
        if !e
            .spend(&ten_per_ten_secs(), "k", 1, now, false)
            .await
            .expect("spend")
            .allowed
        {
            break;
        }
        allowed += 1;
    }
    assert_eq!(allowed, 10);
    // a refund on one node gives the token back to the cluster: the other spends it
    let g = ten_per_ten_secs();
    let tat = tat_of(&s.store, "g", "k").await.expect("tat");
    assert!(
        a.refund_tokens(&g, "k", 1, now)
            .await
            .expect("refund")
            .allowed
    );
    assert_eq!(tat_of(&s.store, "g", "k").await, Some(tat - SEC));
    assert!(b.dry_run(&g, "k", 1, now).await.expect("dry run").allowed);
    assert!(
        b.spend(&g, "k", 1, now, false)
            .await
            .expect("spend")
            .allowed
    );
    assert!(
        !a.spend(&g, "k", 1, now, false)
            .await
            .expect("spend")
            .allowed
    );
    assert!(a.status().degraded.is_none());
}
