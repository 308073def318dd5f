//! Pushes: Kong's vectors, retries applied once, odd values and keys, loads and
//! purges, concurrent pushers, large batches, counts that never go below zero, refused rows.

use super::*;

/// Kong's spec vectors: two pushes leave cur 10/10 and prev 2/1.
pub(super) async fn kong_push_vectors(s: &TestStore) {
    let st = &s.store;
    let first = [
        diff("foo", CUR, 5.0),
        diff("foo", PREV, 2.0),
        diff("1.2.3.4", CUR, 5.0),
        diff("1.2.3.4", PREV, 1.0),
    ];
    let back = st
        .push("ns", push(&PushId::from("n1"), 1, &first))
        .await
        .expect("push")
        .totals;
    assert_eq!(back.len(), 4);
    let second = [diff("foo", CUR, 5.0), diff("1.2.3.4", CUR, 5.0)];
    let mut back = st
        .push("ns", push(&PushId::from("n1"), 2, &second))
        .await
        .expect("push")
        .totals;
    back.sort_by(|a, b| a.key.cmp(&b.key));
    assert_eq!(
        back.iter().map(|t| t.count).collect::<Vec<_>>(),
        vec![10.0, 10.0]
    );
    let all = [
        wk("foo", CUR),
        wk("foo", PREV),
        wk("1.2.3.4", CUR),
        wk("1.2.3.4", PREV),
        wk("nope", CUR),
    ];
    assert_eq!(
        totals(st, "ns", &all).await,
        vec![
            ("1.2.3.4".into(), PREV, 1.0),
            ("1.2.3.4".into(), CUR, 10.0),
            ("foo".into(), PREV, 2.0),
            ("foo".into(), CUR, 10.0)
        ]
    );
    // namespaces are separate
    assert!(totals(st, "other", &all).await.is_empty());
}

/// Kong's second vector: store seeded with 3, a local increment of 3 and one sync leave
/// the store at 6, the local diff at 0 and the local synced value at 6.
pub(super) async fn kong_seeded_sync(s: &TestStore) {
    let st = &s.store;
    st.push(
        "api",
        push(&PushId::from("seed"), 1, &[diff("foo", CUR, 3.0)]),
    )
    .await
    .expect("seed");
    let e = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    let now = UnixMs::from_secs(NOW);
    e.increment("foo", 60, 3.0, now).await.expect("increment");
    e.sync_once(now).await.expect("sync");
    assert_eq!(
        totals(st, "api", &[wk("foo", CUR)]).await,
        vec![("foo".into(), CUR, 6.0)]
    );
    let t = e.counters().table(60).expect("size");
    assert_eq!(t.rate("foo", now, Some(0.0)).current, 6.0, "synced");
    assert_eq!(
        t.rate("foo", now, None).current,
        6.0,
        "synced + diff, so diff is 0"
    );
}

pub(super) async fn retried_push_applies_once(s: &TestStore) {
    let st = &s.store;
    let d = [diff("k", CUR, 2.5), diff("j", CUR, 1.0)];
    st.push("ns", push(&PushId::from("n1"), 7, &d))
        .await
        .expect("push");
    let again = st
        .push("ns", push(&PushId::from("n1"), 7, &d))
        .await
        .expect("retry");
    assert_eq!(
        again.totals.iter().map(|t| t.count).sum::<f64>(),
        3.5,
        "the retry answers with the totals"
    );
    // another node's push with the same number is its own
    st.push("ns", push(&PushId::from("n2"), 7, &d))
        .await
        .expect("other node");
    assert_eq!(
        totals(st, "ns", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 5.0)]
    );
}

/// On a store whose push carries reads (Redis, PostgreSQL), a diff of 0 reads its window
/// as it stands and writes nothing: an absent window stays absent (no row, no hash
/// field), and the push sent again answers the same totals. Fails on PostgreSQL if a
/// diff of 0 is upserted (a row of 0 made, its lock taken).
pub(super) async fn a_diff_of_0_in_a_push_reads_and_writes_nothing(s: &TestStore) {
    let st = &s.store;
    if !st.capabilities().pipelines {
        // SQLite reads beside its pushes: the sync never hands it a diff of 0 to read
        return;
    }
    st.push(
        "ns",
        push(&PushId::from("seed"), 1, &[diff("k", PREV, 4.0)]),
    )
    .await
    .expect("seed");
    let d = [
        diff("k", CUR, 2.0),
        diff("k", PREV, 0.0),
        diff("absent", CUR, 0.0),
        diff("absent", PREV, 0.0),
    ];
    let answer = |totals: &[Total]| {
        // an absent window may be answered as 0 (Redis) or left out (PostgreSQL): both 0
        let mut t: Vec<(String, i64, f64)> = totals
            .iter()
            .filter(|t| t.count != 0.0)
            .map(|t| (t.key.to_string(), t.window_start, t.count))
            .collect();
        t.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
        t
    };
    let first = st
        .push("ns", push(&PushId::from("n1"), 3, &d))
        .await
        .expect("push");
    let want = vec![("k".to_string(), PREV, 4.0), ("k".to_string(), CUR, 2.0)];
    assert_eq!(answer(&first.totals), want);
    let again = st
        .push("ns", push(&PushId::from("n1"), 3, &d))
        .await
        .expect("sent again");
    assert_eq!(
        answer(&again.totals),
        want,
        "the same answer, nothing added"
    );
    assert_eq!(
        totals(
            st,
            "ns",
            &[
                wk("k", PREV),
                wk("k", CUR),
                wk("absent", CUR),
                wk("absent", PREV)
            ]
        )
        .await,
        vec![("k".into(), PREV, 4.0), ("k".into(), CUR, 2.0)],
        "a window read stays as it was: absent ones absent"
    );
}

pub(super) async fn fractional_and_negative(s: &TestStore) {
    let st = &s.store;
    st.push(
        "ns",
        push(
            &PushId::from("n"),
            1,
            &[diff("k", CUR, 0.25), diff("k", CUR, 0.5)],
        ),
    )
    .await
    .expect("push");
    st.push("ns", push(&PushId::from("n"), 2, &[diff("k", CUR, -1.0)]))
        .await
        .expect("push");
    // 0.75 - 1 stops at zero: a stored count is never negative
    assert_eq!(
        totals(st, "ns", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 0.0)]
    );
}

/// Fractional diffs are stored bit for bit: a window pushed once holds the diff, pushed
/// twice the sum as a double adds it (a count read back from text a unit in the last place
/// off is a count the cluster did not take).
pub(super) async fn fractional_counts_keep_every_bit(s: &TestStore) {
    let st = &s.store;
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = || {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        (x >> 11) as f64 / (1u64 << 53) as f64 * 1_000.0
    };
    let mut values = vec![(26.74998368597692, 0.1), (1.0 / 3.0, 2.0 / 3.0)];
    for _ in 0..40 {
        values.push((next(), next()));
    }
    let key = |i: usize| format!("f{i}");
    let first: Vec<Diff> = values
        .iter()
        .enumerate()
        .map(|(i, (a, _))| diff(&key(i), CUR, *a))
        .collect();
    st.push("ns", push(&PushId::from("n"), 1, &first))
        .await
        .expect("push");
    let wanted: Vec<WindowKey> = (0..values.len()).map(|i| wk(&key(i), CUR)).collect();
    let got = totals(st, "ns", &wanted).await;
    for (i, (a, _)) in values.iter().enumerate() {
        let stored = got.iter().find(|t| t.0 == key(i)).expect("stored").2;
        assert_eq!(stored.to_bits(), a.to_bits(), "{a} stored as {stored}");
    }
    let second: Vec<Diff> = values
        .iter()
        .enumerate()
        .map(|(i, (_, b))| diff(&key(i), CUR, *b))
        .collect();
    st.push("ns", push(&PushId::from("n"), 2, &second))
        .await
        .expect("push");
    let got = totals(st, "ns", &wanted).await;
    for (i, (a, b)) in values.iter().enumerate() {
        let stored = got.iter().find(|t| t.0 == key(i)).expect("stored").2;
        assert_eq!(
            stored.to_bits(),
            (a + b).to_bits(),
            "{a} + {b} stored as {stored}"
        );
    }
}

pub(super) async fn odd_keys_round_trip(s: &TestStore) {
    let st = &s.store;
    let keys = [
        "a/b c",
        "x:y:z",
        "100%",
        "ключ",
        "{brace}",
        "*glob?[x]",
        "'quote\"",
    ];
    let d: Vec<Diff> = keys.iter().map(|k| diff(k, CUR, 1.0)).collect();
    st.push("n:s{1}", push(&PushId::from("n"), 1, &d))
        .await
        .expect("push");
    let wanted: Vec<WindowKey> = keys.iter().map(|k| wk(k, CUR)).collect();
    assert_eq!(totals(st, "n:s{1}", &wanted).await.len(), keys.len());
    let loaded = st
        .load_namespace("n:s{1}", &[(60, PREV)])
        .await
        .expect("load");
    assert_eq!(loaded.len(), keys.len());
}

pub(super) async fn load_namespace_returns_live_windows(s: &TestStore) {
    let st = &s.store;
    let d = [
        diff("a", CUR, 1.0),
        diff("a", PREV, 2.0),
        diff("a", PREV - 60, 4.0),
        diff("b", CUR, 8.0),
    ];
    st.push("ns", push(&PushId::from("n"), 1, &d))
        .await
        .expect("push");
    st.push(
        "elsewhere",
        push(&PushId::from("n"), 1, &[diff("a", CUR, 100.0)]),
    )
    .await
    .expect("push");
    let mut loaded: Vec<Total> = st.load_namespace("ns", &[(60, PREV)]).await.expect("load");
    loaded.sort_by(|a, b| (a.key.as_str(), a.window_start).cmp(&(b.key.as_str(), b.window_start)));
    let got: Vec<(String, i64, f64)> = loaded
        .iter()
        .map(|t| (t.key.to_string(), t.window_start, t.count))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".into(), PREV, 2.0),
            ("a".into(), CUR, 1.0),
            ("b".into(), CUR, 8.0)
        ]
    );
}

pub(super) async fn purge_drops_old_windows(s: &TestStore) {
    let st = &s.store;
    let d = [
        diff("a", CUR, 1.0),
        diff("a", PREV, 1.0),
        diff("a", CUR - 180, 1.0),
    ];
    st.push("ns", push(&PushId::from("n"), 1, &d))
        .await
        .expect("push");
    let purged = st.purge(UnixMs::from_secs(NOW)).await.expect("purge");
    let left = totals(st, "ns", &[wk("a", CUR), wk("a", PREV), wk("a", CUR - 180)]).await;
    match st.capabilities().expires_by_itself {
        // Redis expires hashes by TTL and drops the window before the previous on push
        true => assert_eq!(purged, 0),
        false => {
            assert_eq!(purged, 1);
            assert_eq!(left.len(), 2);
        }
    }
}

/// Eight pushers add to the same keys at once: totals exact, nothing deadlocks.
pub(super) async fn concurrent_pushers_same_keys(s: &TestStore) {
    let st = &s.store;
    let keys: Vec<String> = (0..200).map(|i| format!("k{i}")).collect();
    let mut tasks = Vec::new();
    for p in 0..8 {
        let st = st.clone();
        let mut keys = keys.clone();
        if p % 2 == 1 {
            keys.reverse(); // the store must order rows itself
        }
        tasks.push(tokio::spawn(async move {
            let node = PushId::from(format!("pusher-{p}"));
            for round in 0..10u64 {
                let d: Vec<Diff> = keys.iter().map(|k| diff(k, CUR, 1.0)).collect();
                st.push("ns", push(&node, round + 1, &d))
                    .await
                    .expect("push never fails under contention");
            }
        }));
    }
    for t in tasks {
        t.await.expect("pusher");
    }
    let wanted: Vec<WindowKey> = keys.iter().map(|k| wk(k, CUR)).collect();
    let got = totals(st, "ns", &wanted).await;
    assert_eq!(got.len(), 200);
    assert!(got.iter().all(|(_, _, c)| *c == 80.0), "{got:?}");
}

/// A sync reads back only what its push did not answer: the pushed windows' totals come
/// with the push.
pub(super) async fn pushed_windows_are_not_read_again(s: &TestStore) {
    let st = &s.store;
    let a = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    let b = engine(st, SyncMode::Periodic(Duration::from_millis(100)), &[60]);
    let now = UnixMs::from_secs(NOW);
    st.push(
        "api",
        push(
            &PushId::from("seed"),
            1,
            &[diff("k", PREV, 4.0), diff("k", CUR, 1.0)],
        ),
    )
    .await
    .expect("seed");
    a.increment("k", 60, 1.0, now).await.expect("a");
    b.increment("k", 60, 1.0, now).await.expect("b");
    b.sync_once(now).await.expect("b");
    let r = a.sync_once(now).await.expect("a");
    assert_eq!(
        (r.pushed, r.fetched),
        (1, 1),
        "the previous window only: {r:?}"
    );
    let rate = a.counters().rate("k", 60, now, None).expect("size");
    assert_eq!((rate.current, rate.previous), (3.0, 4.0));
    // with nothing to push, both windows are read
    let r = a.sync_once(now).await.expect("a");
    assert_eq!((r.pushed, r.fetched), (0, 2), "{r:?}");
}

/// A batch larger than one push statement goes out in chunks; a failure after the first
/// chunk was applied (its reply lost) loses and doubles nothing.
pub(super) async fn large_batches_go_in_chunks_exactly_once(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine(
        &faulty,
        SyncMode::Periodic(Duration::from_millis(100)),
        &[60],
    );
    let now = UnixMs::from_secs(NOW);
    let keys: Vec<String> = (0..12_000).map(|i| format!("c{i}")).collect();
    for k in &keys {
        e.increment(k, 60, 1.0, now).await.expect("inc");
    }
    e.increment("c7", 60, 2.0, now).await.expect("inc");
    control.plan([Fault::FailAfter]);
    assert!(e.sync_once(now).await.is_err());
    assert_eq!(e.status().pending_diffs, 12_000);
    let r = e.sync_once(now).await.expect("retry");
    assert_eq!(r.pushed, 12_000);
    assert_eq!(e.status().pending_diffs, 0);
    let wanted: Vec<WindowKey> = keys.iter().map(|k| wk(k, CUR)).collect();
    let got = s.store.read("api", &wanted).await.expect("read");
    assert_eq!(got.len(), 12_000);
    let sum: f64 = got.iter().map(|t| t.count).sum();
    assert_eq!(sum, 12_002.0);

    // the same for GCRA buckets: 12,000 advances in chunks, the first applied then lost
    let g = gcra_engine(&faulty, SyncMode::Periodic(Duration::from_millis(100)));
    let now = UnixMs(NOW * 1000);
    for k in &keys {
        assert!(
            g.spend(&ten_per_ten_secs(), k, 1, now, false)
                .await
                .expect("spend")
                .allowed
        );
    }
    control.plan([Fault::FailAfter]);
    assert!(g.sync_once(now).await.is_err());
    assert_eq!(g.status().pending_advances, 12_000);
    assert_eq!(
        g.status().pending_diffs,
        0,
        "a GCRA namespace queues advances, not diffs"
    );
    assert_eq!(g.sync_once(now).await.expect("retry").pushed, 12_000);
    let wanted: Vec<CompactString> = keys.iter().map(|k| k.as_str().into()).collect();
    let tats = s.store.read_tats("g", &wanted).await.expect("read tats");
    assert_eq!(tats.len(), 12_000);
    assert!(
        tats.iter().all(|t| t.tat_ns == NOW_NS + SEC),
        "each advanced once"
    );
}

/// Refunds pushed by several nodes cannot take a window below zero, and a negative
/// diff on a window the store does not hold leaves it absent (0).
pub(super) async fn counts_never_go_below_zero(s: &TestStore) {
    let st = &s.store;
    st.push("ns", push(&PushId::from("a"), 1, &[diff("k", CUR, 5.0)]))
        .await
        .expect("push");
    for node in ["b", "c"] {
        let reply = st
            .push("ns", push(&PushId::from(node), 1, &[diff("k", CUR, -5.0)]))
            .await
            .expect("refund");
        assert!(reply.rejected.is_empty());
    }
    assert_eq!(
        totals(st, "ns", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 0.0)]
    );
    st.push(
        "ns",
        push(
            &PushId::from("a"),
            2,
            &[diff("k", CUR, 3.0), diff("new", CUR, -3.0)],
        ),
    )
    .await
    .expect("push");
    let t = totals(st, "ns", &[wk("k", CUR), wk("new", CUR)]).await;
    assert!(
        t == vec![("k".into(), CUR, 3.0)]
            || t == vec![("k".into(), CUR, 3.0), ("new".into(), CUR, 0.0)],
        "{t:?}"
    );
}

/// A window whose sum the store cannot hold is refused alone: every other window of the
/// push is applied exactly once, a retry applies nothing, and nothing is an error that
/// would hold the batch back for ever.
pub(super) async fn refused_rows_never_hold_back_the_others(s: &TestStore) {
    let st = &s.store;
    // a window's count stays below 2^53 whatever the nodes push together: each of two
    // nodes stayed below it, their sum would not
    let near = swin_core::MAX_COUNT - 992.0;
    st.push("ns", push(&PushId::from("n"), 1, &[diff("big", CUR, near)]))
        .await
        .expect("push");
    let reply = st
        .push("ns", push(&PushId::from("m"), 1, &[diff("big", CUR, near)]))
        .await
        .expect("no error");
    assert_eq!(reply.rejected.len(), 1, "{reply:?}");
    let d = [
        diff("a", CUR, 1.0),
        diff("big", CUR, 992.0),
        diff("z", CUR, 2.0),
    ];
    for attempt in 0..2 {
        let reply = st
            .push("ns", push(&PushId::from("n"), 2, &d))
            .await
            .expect("no error");
        if attempt == 0 {
            assert_eq!(reply.rejected.len(), 1, "{reply:?}");
            assert_eq!(reply.rejected[0].diff.key, "big");
        }
    }
    assert_eq!(
        totals(st, "ns", &[wk("a", CUR), wk("big", CUR), wk("z", CUR)]).await,
        vec![
            ("a".into(), CUR, 1.0),
            ("big".into(), CUR, near),
            ("z".into(), CUR, 2.0)
        ]
    );
    // a key the store cannot hold (PostgreSQL's text has no U+0000) is refused alone too
    let d = [diff("a", CUR, 1.0), diff("nul\0key", CUR, 1.0)];
    let reply = st
        .push("ns", push(&PushId::from("n"), 3, &d))
        .await
        .expect("no error");
    assert!(reply.rejected.len() <= 1, "{reply:?}");
    assert_eq!(
        totals(st, "ns", &[wk("a", CUR)]).await,
        vec![("a".into(), CUR, 2.0)]
    );
}

/// Counts are doubles and every store keeps them exactly, however small or odd (the
/// whole-chain property found that Redis' HINCRBYFLOAT kept 17 digits after the point,
/// so 2^-20 came back as 9.5367431641e-7).
pub(super) async fn doubles_round_trip_exactly(s: &TestStore) {
    let values = [
        1.2750726484814737e-227,
        2f64.powi(-20),
        0.1,
        1e-300,
        f64::MIN_POSITIVE,
        123_456.789,
        4_503_599_627_370_496.5,
    ];
    let d: Vec<Diff> = values
        .iter()
        .enumerate()
        .map(|(i, v)| diff(&format!("v{i}"), CUR, *v))
        .collect();
    let reply = s
        .store
        .push("ns", push(&PushId::from("n"), 1, &d))
        .await
        .expect("push");
    let mut returned: Vec<(String, f64)> = reply
        .totals
        .iter()
        .map(|t| (t.key.to_string(), t.count))
        .collect();
    returned.sort_by(|a, b| a.0.cmp(&b.0));
    let want: Vec<(String, f64)> = values
        .iter()
        .enumerate()
        .map(|(i, v)| (format!("v{i}"), *v))
        .collect();
    assert_eq!(returned, want, "the push's totals");
    let keys: Vec<WindowKey> = (0..values.len())
        .map(|i| wk(&format!("v{i}"), CUR))
        .collect();
    let read: Vec<(String, f64)> = totals(&s.store, "ns", &keys)
        .await
        .into_iter()
        .map(|(k, _, c)| (k, c))
        .collect();
    assert_eq!(read, want, "read back");
}
