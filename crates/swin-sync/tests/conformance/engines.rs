//! Engines over a store: convergence, outages and faults, synchronous mode, requested
//! syncs, resets, refused windows, unconfirmed pushes and the last push at shutdown.
//!
//! Over 500 lines: `every_call_honours_its_faults` is a table of every store call under
//! every fault, long because the table is.

use super::*;

/// Two nodes on one store: 50 hits on A and 70 on B read 120 on both after syncs.
pub(super) async fn two_engines_converge(s: &TestStore) {
    let st = &s.store;
    let a = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[1, 60]);
    let b = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[1, 60]);
    let now = UnixMs::from_secs(NOW);
    for _ in 0..50 {
        a.increment("shared", 60, 1.0, now).await.expect("a");
    }
    for _ in 0..70 {
        b.increment("shared", 60, 1.0, now).await.expect("b");
    }
    a.sync_once(now).await.expect("sync a");
    b.sync_once(now).await.expect("sync b");
    a.sync_once(now).await.expect("sync a again");
    for e in [&a, &b] {
        let r = e.counters().rate("shared", 60, now, None).expect("size");
        assert_eq!(r.current, 120.0, "{r:?}");
    }
    assert_eq!(
        totals(st, "api", &[wk("shared", CUR)]).await,
        vec![("shared".into(), CUR, 120.0)]
    );
    // hits that B pushes after A last used the key still reach A (A does not touch it)
    for _ in 0..5 {
        b.increment("shared", 60, 1.0, now).await.expect("b");
    }
    b.sync_once(now).await.expect("sync b");
    a.sync_once(now).await.expect("sync a, key idle on a");
    let r = a.counters().rate("shared", 60, now, None).expect("size");
    assert_eq!(r.current, 125.0, "{r:?}");
    // a node that never held a key reads the cluster total after one sync of being asked
    let c = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    assert_eq!(
        c.counters()
            .table(60)
            .expect("size")
            .rate_tracked("shared", now)
            .current,
        0.0
    );
    c.sync_once(now).await.expect("sync c");
    assert_eq!(
        c.counters()
            .rate("shared", 60, now, None)
            .expect("size")
            .current,
        125.0
    );
    // and a node that starts warms up from the store
    let d = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    assert!(d.warm_up(now).await.expect("warm up") >= 1);
    assert_eq!(
        d.counters()
            .rate("shared", 60, now, None)
            .expect("size")
            .current,
        125.0
    );
    // a running engine's fill (a namespace rebuilt by a reload) loads only the keys it
    // does not hold: a key it keeps current itself is not set back to what the load read
    // (here the store's count went down since this engine synced it; a load read before
    // its last sync looks the same)
    b.increment("shared", 60, -5.0, now)
        .await
        .expect("b gives back");
    b.sync_once(now).await.expect("sync b");
    for _ in 0..3 {
        b.increment("other", 60, 1.0, now).await.expect("b");
    }
    b.sync_once(now).await.expect("sync b");
    assert!(d.fill(now).await.expect("fill") >= 2);
    let current = |key: &str| d.counters().rate(key, 60, now, None).expect("size").current;
    assert_eq!((current("shared"), current("other")), (125.0, 3.0));
    d.warm_up(now).await.expect("warm up");
    assert_eq!(
        current("shared"),
        120.0,
        "a start's warm-up takes the store's"
    );
}

/// A key used on A long ago (but still in its window) gets B's later hits at A's next
/// sync: every held key is refreshed, not only recently used ones.
pub(super) async fn idle_keys_are_still_refreshed(s: &TestStore) {
    let st = &s.store;
    let a = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[3600]);
    let b = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[3600]);
    let t0 = UnixMs::from_secs(1_763_784_000 + 60);
    let later = UnixMs::from_secs(1_763_784_000 + 1800);
    a.increment("idle", 3600, 1.0, t0).await.expect("a");
    a.sync_once(t0).await.expect("sync a");
    b.increment("idle", 3600, 4.0, later).await.expect("b");
    b.sync_once(later).await.expect("sync b");
    a.sync_once(later)
        .await
        .expect("sync a, 29 minutes after it last used the key");
    let r = a.counters().rate("idle", 3600, later, None).expect("size");
    assert_eq!(r.current, 5.0, "{r:?}");
}

/// Failures before and after the store applied a push: nothing lost, nothing doubled.
/// A key read from the store (a refund's or a give-back's read) while this node's push of
/// it is unconfirmed keeps the unconfirmed hits in the node's view: a give-back after it
/// is taken from the view with them, not from the store's count without them (which gave
/// back nothing, and the push then charged it all).
pub(super) async fn a_key_read_while_its_push_is_unconfirmed_keeps_it_in_view(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine(
        &faulty,
        SyncMode::Periodic(Duration::from_millis(100)),
        &[60],
    );
    let now = UnixMs::from_secs(NOW);
    e.increment("k", 60, 150.0, now).await.expect("inc");
    control.plan([Fault::FailBefore]);
    assert!(e.sync_once(now).await.is_err(), "the push failed");
    e.load_key("k", now).await.expect("read the key");
    let view = || e.counters().rate("k", 60, now, None).expect("size").current;
    assert_eq!(view(), 150.0, "the unconfirmed push stays in view");
    // a give-back of 69 (a commit of 81 on a reservation of 150) out of the view
    e.refund_hits("k", 60, 69.0, now).await.expect("give back");
    e.sync_once(now).await.expect("store back");
    assert_eq!(
        totals(&s.store, "api", &[wk("k", NOW - NOW % 60)]).await,
        vec![("k".to_owned(), NOW - NOW % 60, 81.0)],
        "the store holds what was used"
    );
}

pub(super) async fn failures_lose_and_double_nothing(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine(
        &faulty,
        SyncMode::Periodic(Duration::from_millis(100)),
        &[60],
    );
    let now = UnixMs::from_secs(NOW);
    let mut expected = 0.0;
    for round in 0..6 {
        for _ in 0..10 {
            e.increment("k", 60, 1.0, now).await.expect("inc");
            expected += 1.0;
        }
        match round % 3 {
            0 => control.plan([Fault::FailBefore]),
            1 => control.plan([Fault::FailAfter]),
            _ => {}
        }
        let r = e.sync_once(now).await;
        assert_eq!(r.is_err(), round % 3 != 2, "round {round}");
        if r.is_err() {
            assert!(e.status().degraded.is_some());
            assert!(e.status().pending_diffs > 0);
        }
        // the local view never loses a hit
        assert_eq!(
            e.counters().rate("k", 60, now, None).expect("size").current,
            expected
        );
    }
    control.set_down(true);
    e.increment("k", 60, 5.0, now)
        .await
        .expect("inc while down");
    expected += 5.0;
    assert!(e.sync_once(now).await.is_err());
    control.set_down(false);
    e.sync_once(now).await.expect("store back");
    e.sync_once(now).await.expect("nothing left");
    assert!(e.status().degraded.is_none());
    assert_eq!(e.status().pending_diffs, 0);
    assert_eq!(
        totals(&s.store, "api", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, expected)]
    );
}

/// Synchronous mode: every answer is the store's total, including the caller's hit.
pub(super) async fn synchronous_mode_reads_store_totals(s: &TestStore) {
    let st = &s.store;
    let a = engine(st, SyncMode::Synchronous, &[60]);
    let b = engine(st, SyncMode::Synchronous, &[60]);
    let now = UnixMs::from_secs(NOW);
    st.push(
        "api",
        push(&PushId::from("seed"), 1, &[diff("k", PREV, 10.0)]),
    )
    .await
    .expect("seed");
    for i in 1..=10 {
        let e = if i % 2 == 0 { &a } else { &b };
        let r = e.increment("k", 60, 1.0, now).await.expect("inc");
        assert_eq!(r.current, f64::from(i));
        assert_eq!(r.previous, 10.0);
        assert_eq!(r.rate, f64::from(i) + 5.0);
    }
    // concurrent callers each see a total that includes their own hit
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let a = a.clone();
        tasks.push(tokio::spawn(async move {
            a.increment("c", 60, 1.0, now).await.expect("inc").current
        }));
    }
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(t.await.expect("task"));
    }
    seen.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
    assert_eq!(seen, (1..=32).map(f64::from).collect::<Vec<_>>());
}

/// A synchronous namespace whose store is down counts locally and pushes later, once.
pub(super) async fn synchronous_mode_falls_back_when_down(s: &TestStore) {
    falls_back_when_down(s, swin_sync::DEFAULT_ANSWER_WITHIN).await;
}

/// The same with the hit answered before its round trip ended (a tiny answer time: on a
/// loaded machine, a round trip not begun within it): the round trip owns the hit, counts
/// it here when the store fails it, and a later sync pushes it, once.
pub(super) async fn a_fallback_hit_answered_late_is_pushed_once(s: &TestStore) {
    falls_back_when_down(s, Duration::from_micros(1)).await;
}

async fn falls_back_when_down(s: &TestStore, answer_within: Duration) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine_answering(&faulty, SyncMode::Synchronous, &[60], answer_within);
    let now = UnixMs::from_secs(NOW);
    e.increment("k", 60, 1.0, now).await.expect("inc");
    // answered late too, the first hit lands in the store (and in the node's view) later
    for _ in 0..100 {
        let table = e.counters().table(60).expect("table");
        if table.rate("k", now, None).current == 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    control.set_down(true);
    let r = e
        .increment("k", 60, 1.0, now)
        .await
        .expect("answered from local memory");
    assert_eq!(r.current, 2.0);
    assert!(e.status().degraded.is_some());
    control.set_down(false);
    // a sync pushes it: the first one, unless the increment was answered late (its round
    // trip not begun within the answer time), then its round trip counts it here when it
    // fails, and a sync after that pushes it
    let mut stored = Vec::new();
    for _ in 0..50 {
        e.sync_once(now).await.expect("push the fallback hit");
        stored = totals(&s.store, "api", &[wk("k", CUR)]).await;
        if stored != vec![("k".into(), CUR, 1.0)] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stored, vec![("k".into(), CUR, 2.0)], "{:?}", e.status());
}

/// A store that hangs costs synchronous increments one timeout, not one each: after the
/// first times out, the namespace answers from local memory at once until a sync reaches
/// the store again; then increments go to the store again, and nothing is lost.
pub(super) async fn a_hanging_store_costs_one_timeout_not_one_per_request(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &[WindowSize::new(60).expect("size")],
        CounterOptions::default(),
    ));
    let e = Arc::new(NamespaceSync::new(
        counters,
        SyncMode::Synchronous,
        Some(faulty.clone()),
        swin_sync::new_node_id().into(),
        Duration::from_millis(300),
    ));
    let now = UnixMs::from_secs(NOW);
    control.set_hanging(true);
    let first = std::time::Instant::now();
    e.increment("k", 60, 1.0, now).await.expect("inc");
    assert!(
        first.elapsed() >= Duration::from_millis(300),
        "the first waits its timeout"
    );
    let rest = std::time::Instant::now();
    for _ in 0..20 {
        e.increment("k", 60, 1.0, now).await.expect("inc");
    }
    assert!(
        rest.elapsed() < Duration::from_millis(300),
        "20 increments took {:?}: each waited for the store",
        rest.elapsed()
    );
    assert_eq!(e.status().degraded, Some("store_unreachable"));
    control.set_hanging(false);
    // the first increment's round trip owns it until its own call times out (about
    // when its caller stopped waiting) and counts it here then: syncs reach the store
    // again and, once that has happened, push it too
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        e.sync_once(now)
            .await
            .expect("a sync reaches the store again");
        let stored = totals(&s.store, "api", &[wk("k", CUR)]).await;
        if stored == vec![("k".into(), CUR, 21.0)] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the 21 increments never all reached the store: {stored:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = e.increment("k", 60, 1.0, now).await.expect("inc");
    assert_eq!(r.current, 22.0, "answered with the store's total");
    assert_eq!(
        totals(&s.store, "api", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 22.0)]
    );
}

/// Syncs asked for at once share one run: a burst of `/sync` requests costs the store
/// one scan, not one each.
pub(super) async fn requested_syncs_share_one_run(s: &TestStore) {
    let e = engine(
        &s.store,
        SyncMode::Periodic(Duration::from_secs(3600)),
        &[60],
    );
    let now = UnixMs::from_secs(NOW);
    for i in 0..200 {
        e.increment(&format!("k{i}"), 60, 1.0, now)
            .await
            .expect("inc");
    }
    let before = e.status().syncs;
    let runs: Vec<_> = (0..10)
        .map(|_| {
            let e = e.clone();
            tokio::spawn(async move { e.sync_requested(now).await.map(|r| r.pushed) })
        })
        .collect();
    let mut pushed = Vec::new();
    for r in runs {
        pushed.push(r.await.expect("task").expect("sync"));
    }
    let ran = e.status().syncs - before;
    assert!(ran <= 2, "{ran} syncs ran for 10 requests");
    assert!(pushed.contains(&200), "{pushed:?}");
    assert_eq!(
        totals(&s.store, "api", &[wk("k7", CUR)]).await,
        vec![("k7".into(), CUR, 1.0)]
    );
}

/// Cancelling the engine pushes once more before it returns.
pub(super) async fn shutdown_pushes_last_diffs(s: &TestStore) {
    let e = engine(
        &s.store,
        SyncMode::Periodic(Duration::from_secs(3600)),
        &[60],
    );
    let now = UnixMs::from_system_time(std::time::SystemTime::now());
    for _ in 0..7 {
        e.increment("bye", 60, 1.0, now).await.expect("inc");
    }
    let cancel = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(e.clone().run(cancel.clone()));
    cancel.cancel();
    task.await.expect("engine");
    let start = WindowSize::new(60).expect("size").start_of(now);
    let got = s
        .store
        .read("api", &[wk("bye", start)])
        .await
        .expect("read");
    assert_eq!(got.first().map(|t| t.count), Some(7.0));
}

/// A reset on one node reaches the others at their next sync, for counters and buckets.
pub(super) async fn reset_reaches_every_node(s: &TestStore) {
    let st = &s.store;
    let a = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    let b = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    let now = UnixMs::from_secs(NOW);
    for _ in 0..5 {
        a.increment("k", 60, 1.0, now).await.expect("a");
    }
    b.increment("k", 60, 1.0, now).await.expect("b");
    a.sync_once(now).await.expect("a");
    b.sync_once(now).await.expect("b");
    assert_eq!(
        b.counters().rate("k", 60, now, None).expect("size").current,
        6.0
    );
    a.reset("k").await.expect("reset");
    assert_eq!(
        a.counters().rate("k", 60, now, None).expect("size").current,
        0.0
    );
    b.sync_once(now).await.expect("b after the reset");
    assert_eq!(
        b.counters().rate("k", 60, now, None).expect("size").current,
        0.0
    );
    // hits after the reset count from zero everywhere
    b.increment("k", 60, 2.0, now).await.expect("b");
    b.sync_once(now).await.expect("b");
    // (a no longer holds the key: asking for it makes the next sync fetch it)
    a.counters().table(60).expect("size").rate_tracked("k", now);
    a.sync_once(now).await.expect("a");
    assert_eq!(
        a.counters().rate("k", 60, now, None).expect("size").current,
        2.0
    );

    let g = ten_per_ten_secs();
    let now = UnixMs(NOW * 1000);
    let (x, y) = (
        gcra_engine(st, SyncMode::Periodic(Duration::from_millis(100))),
        gcra_engine(st, SyncMode::Periodic(Duration::from_millis(100))),
    );
    for _ in 0..10 {
        x.spend(&g, "k", 1, now, false).await.expect("spend");
    }
    x.sync_once(now).await.expect("x");
    y.spend(&g, "k", 1, now, false)
        .await
        .expect("y's own spend");
    y.sync_once(now).await.expect("y");
    assert!(!y.dry_run(&g, "k", 1, now).await.expect("dry run").allowed);
    x.reset("k").await.expect("reset");
    y.sync_once(now).await.expect("y after the reset");
    assert!(y.dry_run(&g, "k", 1, now).await.expect("dry run").allowed);
}

/// An engine whose push meets a refused window (a key PostgreSQL cannot hold; the HTTP
/// edge refuses such keys, the engine must not depend on it) drops it, counted in its
/// status, and keeps syncing the rest: the namespace is not left degraded.
pub(super) async fn a_refused_window_does_not_degrade_the_namespace(s: &TestStore) {
    let st = &s.store;
    let e = engine(st, SyncMode::Periodic(Duration::from_secs(60)), &[60]);
    let now = UnixMs::from_secs(NOW);
    let t = e.counters().table(60).expect("table");
    let store_kind = st.kind();
    t.increment("ok", 4.0, now).expect("count");
    t.increment("nul\0key", 1.0, now).expect("count");
    e.sync_once(now).await.expect("sync succeeds");
    let status = e.status();
    assert!(status.degraded.is_none(), "{status:?}");
    let expected_rejected = u64::from(store_kind == swin_sync::store::StoreKind::Postgres);
    assert_eq!(status.rejected_windows, expected_rejected, "{status:?}");
    assert_eq!(status.pending_diffs, 0);
    assert_eq!(
        totals(st, "api", &[wk("ok", CUR)]).await,
        vec![("ok".into(), CUR, 4.0)]
    );
    // the next sync has nothing left over
    assert_eq!(e.sync_once(now).await.expect("sync").pushed, 0);
}

/// A stopped engine hands back what its store did not confirm, under its own identity
/// and sequence numbers: replayed (from the spool, or twice by two nodes sharing it),
/// a chunk the store did apply before its reply was lost is not applied again, and
/// the rest is applied once. Windows and GCRA advances alike.
pub(super) async fn unconfirmed_pushes_replay_exactly_once(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let now = UnixMs::from_secs(NOW);
    let e = engine(
        &faulty,
        SyncMode::Periodic(Duration::from_secs(3600)),
        &[60],
    );
    e.increment("k", 60, 5.0, now).await.expect("inc");
    control.plan([Fault::FailAfter]); // applied, the reply lost
    e.sync_once(now).await.expect_err("reply lost");
    e.increment("k", 60, 2.0, now).await.expect("inc");
    e.increment("other", 60, 1.0, now).await.expect("inc");
    let g = gcra_engine(&faulty, SyncMode::Periodic(Duration::from_secs(3600)));
    let limit = ten_per_ten_secs();
    for _ in 0..3 {
        g.spend(&limit, "b", 1, now, false).await.expect("spend");
    }
    control.plan([Fault::FailAfter]); // the advances applied, the reply lost
    g.sync_once(now).await.expect_err("reply lost");

    let windows = e.take_unconfirmed(now).await;
    let buckets = g.take_unconfirmed(now).await;
    assert_eq!(windows.push_id, e.push_id().as_str());
    assert_eq!(windows.rows(), 3, "{windows:?}");
    assert_eq!(windows.hits(), 8.0);
    assert_eq!(e.take_unconfirmed(now).await.rows(), 0, "taken once");
    // through the spool's encoding, and replayed twice
    let json = serde_json::to_string(&(windows, buckets)).expect("encode");
    for _ in 0..2 {
        let (mut w, mut b): (swin_sync::Unconfirmed, swin_sync::Unconfirmed) =
            serde_json::from_str(&json).expect("decode");
        w.push(&s.store, Duration::from_secs(5))
            .await
            .expect("replay");
        b.push(&s.store, Duration::from_secs(5))
            .await
            .expect("replay");
        assert!(w.is_empty() && b.is_empty());
    }
    assert_eq!(
        totals(&s.store, "api", &[wk("k", CUR), wk("other", CUR)]).await,
        vec![("k".into(), CUR, 7.0), ("other".into(), CUR, 1.0)]
    );
    assert_eq!(tat_of(&s.store, "g", "b").await, Some(NOW_NS + 3 * SEC));
}

/// The fault-injecting store honours its faults in every call of the boundary:
/// `FailBefore` reaches nothing, `FailAfter` runs the call and loses its reply.
/// Every call of the boundary, once per fault kind: long because the boundary is.
pub(super) async fn every_call_honours_its_faults(s: &TestStore) {
    use swin_sync::StoreError;
    let (faulty, control) = common::faulty(&s.store);
    let ns = "faults";
    let diffs = [diff("k", CUR, 5.0)];
    let push = Push {
        node_id: &swin_sync::PushId::new("n"),
        seq: Some(1),
        diffs: &diffs,
    };
    let advances = [Advance {
        key: "k".into(),
        ns: 1_000,
    }];
    let tat_push = TatPush {
        node_id: &swin_sync::PushId::new("n"),
        seq: Some(2),
        now_ns: NOW * 1_000_000_000,
        advances: &advances,
    };
    let keys = [wk("k", CUR)];
    let buckets = [CompactString::from("k")];
    let now = UnixMs::from_secs(NOW);
    let injected = |what: &str, failed: bool| assert!(failed, "{what}: no injected failure");
    for fault in [Fault::FailBefore, Fault::FailAfter] {
        control.plan([fault; 12]);
        let e = |r: Result<(), StoreError>| matches!(r, Err(StoreError::Injected));
        injected("migrate", e(faulty.migrate().await));
        injected("push", e(faulty.push(ns, push).await.map(drop)));
        injected("read", e(faulty.read(ns, &keys).await.map(drop)));
        injected(
            "load_namespace",
            e(faulty.load_namespace(ns, &[(60, PREV)]).await.map(drop)),
        );
        injected("purge", e(faulty.purge(now).await.map(drop)));
        injected(
            "push_tats",
            e(faulty.push_tats(ns, tat_push).await.map(drop)),
        );
        injected(
            "read_tats",
            e(faulty.read_tats(ns, &buckets).await.map(drop)),
        );
        injected("load_tats", e(faulty.load_tats(ns, 0).await.map(drop)));
        // what the calls above did reached the store only after their faults
        let applied = s.store.read(ns, &keys).await.expect("read");
        let tats = s.store.read_tats(ns, &buckets).await.expect("read tats");
        match fault {
            Fault::FailBefore => {
                assert!(applied.is_empty(), "{applied:?}");
                assert!(tats.is_empty(), "{tats:?}");
            }
            Fault::FailAfter => {
                assert_eq!(applied.len(), 1, "the push was applied, its reply lost");
                assert_eq!(applied[0].count, 5.0);
                assert_eq!(tats.len(), 1, "the advance was applied, its reply lost");
            }
            Fault::Slow(_) | Fault::Late(_) => unreachable!("not planned here"),
        }
        // a count for the reset to remove, pushed around the faults
        let seq = if fault == Fault::FailBefore { 3 } else { 4 };
        let direct = Push {
            node_id: &swin_sync::PushId::new("direct"),
            seq: Some(seq),
            diffs: &diffs,
        };
        s.store.push(ns, direct).await.expect("push");
        injected("reset", e(faulty.reset(ns, "k", &[60]).await));
        injected("ping", e(faulty.ping().await.map(drop)));
        // strict admission's calls, on a key of their own
        let hold = swin_sync::Hold {
            key: "held".into(),
            window_size: 60,
            window_start: CUR,
            request: swin_core::HoldRequest {
                limit: 10.0,
                weight: 0.0,
                need: 1.0,
                want: 1.0,
            },
        };
        injected(
            "hold",
            e(faulty
                .hold(ns, &Holder::from("h"), std::slice::from_ref(&hold))
                .await
                .map(drop)),
        );
        let reserve = swin_sync::Grant {
            key: "reserved".into(),
            request: swin_core::GrantRequest {
                seq: 1,
                now_ns: NOW * 1_000_000_000,
                horizon_ns: 0,
                emission_ns: 1_000_000,
                burst: 10,
                need: 1,
                want: 1,
            },
        };
        injected(
            "reserve",
            e(faulty
                .grant(ns, &Holder::from("h"), std::slice::from_ref(&reserve))
                .await
                .map(drop)),
        );
        let applied = s.store.read(ns, &keys).await.expect("read");
        assert_eq!(
            applied.is_empty(),
            fault == Fault::FailAfter,
            "a reset runs only when its fault comes after it: {applied:?}"
        );
        s.store
            .reset(ns, "k", &[60])
            .await
            .expect("clear the round");
    }
    // the plan is spent: calls go through again
    faulty.ping().await.expect("ping");
}

#[tokio::test]
pub(super) async fn local_only_touches_no_store() {
    let s = TestStore::sqlite().await;
    let (faulty, control) = common::faulty(&s.store);
    control.set_down(true); // any store call would fail
    let e = engine(&faulty, SyncMode::LocalOnly, &[60]);
    let now = UnixMs::from_secs(NOW);
    assert_eq!(
        e.increment("k", 60, 2.0, now).await.expect("inc").current,
        2.0
    );
    e.sync_once(now).await.expect("local sync needs no store");
    assert!(e.store().is_none());
    assert!(e.status().degraded.is_none());
}
