//! One conformance suite, run against the real PostgreSQL, Redis and SQLite.
//!
//! Long on purpose: every scenario runs against every store (`swin_testkit::for_stores!`), so a
//! store conforms exactly when this one file passes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use swin_core::{
    Advance, CompactString, CounterOptions, Diff, Gcra, NamespaceCounters, Total, UnixMs,
    WindowSize,
};
use swin_sync::store::Fault;
use swin_sync::{Holder, PushId};
use swin_sync::{NamespaceSync, Push, Store, SyncMode, TatPush, WindowKey};
use swin_testkit::TestStore;

const NOW: i64 = 1_763_784_030; // 30 s into a minute
const CUR: i64 = 1_763_784_000;
const PREV: i64 = CUR - 60;

fn diff(key: &str, start: i64, value: f64) -> Diff {
    Diff {
        key: key.into(),
        window_size: 60,
        window_start: start,
        value,
    }
}

fn wk(key: &str, start: i64) -> WindowKey {
    WindowKey {
        key: key.into(),
        window_size: 60,
        window_start: start,
    }
}

async fn totals(store: &Store, ns: &str, keys: &[WindowKey]) -> Vec<(String, i64, f64)> {
    let mut t: Vec<_> = store
        .read(ns, keys)
        .await
        .expect("read")
        .into_iter()
        .map(|t| (t.key.to_string(), t.window_start, t.count))
        .collect();
    t.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    t
}

fn push<'a>(node: &'a PushId, seq: u64, diffs: &'a [Diff]) -> Push<'a> {
    Push {
        node_id: node,
        seq: Some(seq),
        diffs,
    }
}

fn engine(store: &Store, mode: SyncMode, sizes: &[u64]) -> Arc<NamespaceSync> {
    let sizes: Vec<WindowSize> = sizes
        .iter()
        .map(|s| WindowSize::new(*s).expect("size"))
        .collect();
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &sizes,
        CounterOptions::default(),
    ));
    Arc::new(NamespaceSync::new(
        counters,
        mode,
        Some(store.clone()),
        swin_sync::new_node_id().into(),
        Duration::from_secs(5),
    ))
}

/// Kong's spec vectors: two pushes leave cur 10/10 and prev 2/1.
async fn kong_push_vectors(s: &TestStore) {
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
async fn kong_seeded_sync(s: &TestStore) {
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

async fn retried_push_applies_once(s: &TestStore) {
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

async fn fractional_and_negative(s: &TestStore) {
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

async fn odd_keys_round_trip(s: &TestStore) {
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

async fn load_namespace_returns_live_windows(s: &TestStore) {
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

async fn purge_drops_old_windows(s: &TestStore) {
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
async fn concurrent_pushers_same_keys(s: &TestStore) {
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

/// Two nodes on one store: 50 hits on A and 70 on B read 120 on both after syncs.
async fn two_engines_converge(s: &TestStore) {
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
}

/// A key used on A long ago (but still in its window) gets B's later hits at A's next
/// sync: every held key is refreshed, not only recently used ones.
async fn idle_keys_are_still_refreshed(s: &TestStore) {
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
async fn failures_lose_and_double_nothing(s: &TestStore) {
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
async fn synchronous_mode_reads_store_totals(s: &TestStore) {
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

/// A synchronous namespace whose store is down counts locally and pushes later.
async fn synchronous_mode_falls_back_when_down(s: &TestStore) {
    let (faulty, control) = common::faulty(&s.store);
    let e = engine(&faulty, SyncMode::Synchronous, &[60]);
    let now = UnixMs::from_secs(NOW);
    e.increment("k", 60, 1.0, now).await.expect("inc");
    control.set_down(true);
    let r = e
        .increment("k", 60, 1.0, now)
        .await
        .expect("answered from local memory");
    assert_eq!(r.current, 2.0);
    assert!(e.status().degraded.is_some());
    control.set_down(false);
    e.sync_once(now).await.expect("push the fallback hit");
    assert_eq!(
        totals(&s.store, "api", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 2.0)],
        "{:?}",
        e.status()
    );
}

/// A store that hangs costs synchronous increments one timeout, not one each: after the
/// first times out, the namespace answers from local memory at once until a sync reaches
/// the store again; then increments go to the store again, and nothing is lost.
async fn a_hanging_store_costs_one_timeout_not_one_per_request(s: &TestStore) {
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
    e.sync_once(now)
        .await
        .expect("a sync reaches the store again");
    let r = e.increment("k", 60, 1.0, now).await.expect("inc");
    assert_eq!(r.current, 22.0, "answered with the store's total");
    assert_eq!(
        totals(&s.store, "api", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 22.0)]
    );
}

/// Syncs asked for at once share one run: a burst of `/sync` requests costs the store
/// one scan, not one each.
async fn requested_syncs_share_one_run(s: &TestStore) {
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
async fn shutdown_pushes_last_diffs(s: &TestStore) {
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

const SEC: i64 = 1_000_000_000;
const NOW_NS: i64 = NOW * SEC;

fn adv(key: &str, secs: i64) -> Advance {
    Advance {
        key: key.into(),
        ns: secs * SEC,
    }
}

/// The node every `tat_push` comes from.
static N1: std::sync::LazyLock<PushId> = std::sync::LazyLock::new(|| PushId::from("n1"));

fn tat_push<'a>(seq: Option<u64>, now_ns: i64, advances: &'a [Advance]) -> TatPush<'a> {
    TatPush {
        node_id: &N1,
        seq,
        now_ns,
        advances,
    }
}

async fn tat_of(store: &Store, ns: &str, key: &str) -> Option<i64> {
    let keys = [CompactString::from(key)];
    store
        .read_tats(ns, &keys)
        .await
        .expect("read tats")
        .first()
        .map(|t| t.tat_ns)
}

/// The store applies advances as `tat = max(tat, now) + Σ advances`, once per seq.
async fn tat_advances_apply_max_then_add(s: &TestStore) {
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

fn gcra_engine(store: &Store, mode: SyncMode) -> Arc<NamespaceSync> {
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

fn ten_per_ten_secs() -> Gcra {
    Gcra::new(10, 10, Duration::from_secs(10)).expect("gcra")
}

/// Two periodic nodes share one bucket: after syncs both hold every spend, and a node
/// that starts warms up with it. Failed pushes lose and double nothing.
async fn gcra_buckets_are_shared(s: &TestStore) {
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
async fn gcra_synchronous_admits_exactly_the_burst(s: &TestStore) {
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

/// A reset on one node reaches the others at their next sync, for counters and buckets.
async fn reset_reaches_every_node(s: &TestStore) {
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

/// A sync reads back only what its push did not answer: the pushed windows' totals come
/// with the push.
async fn pushed_windows_are_not_read_again(s: &TestStore) {
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
async fn large_batches_go_in_chunks_exactly_once(s: &TestStore) {
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
async fn counts_never_go_below_zero(s: &TestStore) {
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
async fn refused_rows_never_hold_back_the_others(s: &TestStore) {
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

/// An engine whose push meets a refused window (a key PostgreSQL cannot hold; the HTTP
/// edge refuses such keys, the engine must not depend on it) drops it, counted in its
/// status, and keeps syncing the rest: the namespace is not left degraded.
async fn a_refused_window_does_not_degrade_the_namespace(s: &TestStore) {
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
async fn unconfirmed_pushes_replay_exactly_once(s: &TestStore) {
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

/// Counts are doubles and every store keeps them exactly, however small or odd (the
/// whole-chain property found that Redis' HINCRBYFLOAT kept 17 digits after the point,
/// so 2^-20 came back as 9.5367431641e-7).
async fn doubles_round_trip_exactly(s: &TestStore) {
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

/// The fault-injecting store honours its faults in every call of the boundary:
/// `FailBefore` reaches nothing, `FailAfter` runs the call and loses its reply.
/// Every call of the boundary, once per fault kind: long because the boundary is.
async fn every_call_honours_its_faults(s: &TestStore) {
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
            Fault::Slow(_) => unreachable!("not planned here"),
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
        injected("ping", e(faulty.ping().await));
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
        let reserve = swin_sync::Reserve {
            key: "reserved".into(),
            request: swin_core::ReserveRequest {
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
                .reserve(ns, &Holder::from("h"), std::slice::from_ref(&reserve))
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

swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite] [
    every_call_honours_its_faults,
    a_hanging_store_costs_one_timeout_not_one_per_request,
    requested_syncs_share_one_run,
    doubles_round_trip_exactly,
    unconfirmed_pushes_replay_exactly_once,
    counts_never_go_below_zero,
    refused_rows_never_hold_back_the_others,
    a_refused_window_does_not_degrade_the_namespace,
    large_batches_go_in_chunks_exactly_once,
    pushed_windows_are_not_read_again,
    reset_reaches_every_node,
    tat_advances_apply_max_then_add,
    gcra_buckets_are_shared,
    gcra_synchronous_admits_exactly_the_burst,
    kong_push_vectors,
    kong_seeded_sync,
    retried_push_applies_once,
    fractional_and_negative,
    odd_keys_round_trip,
    load_namespace_returns_live_windows,
    purge_drops_old_windows,
    concurrent_pushers_same_keys,
    two_engines_converge,
    failures_lose_and_double_nothing,
    idle_keys_are_still_refreshed,
    synchronous_mode_reads_store_totals,
    synchronous_mode_falls_back_when_down,
    shutdown_pushes_last_diffs
]);

#[tokio::test]
async fn local_only_touches_no_store() {
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

/// Redis runs a script without rolling it back: the push script checks every window
/// before its first write. A stored count that is not a number (written by hand) used to
/// fail the script after the windows before it were added, with the sequence number not
/// recorded, so every retry added them again. Now that window is refused alone, the
/// others are applied, and a retry applies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_push_checks_before_writing_and_a_retry_applies_once() {
    let s = TestStore::redis();
    let Store::Redis(r) = &s.store else {
        unreachable!("a redis store")
    };
    let client = ::redis::Client::open(s.url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let hash = format!("{}:{{2:ns:k}}:60", r.prefix());
    let _: () = ::redis::cmd("HSET")
        .arg(&hash)
        .arg(CUR)
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .expect("corrupt");
    // one hash, so one script call: the previous window first, then the corrupt one
    let d = [diff("k", PREV, 1.0), diff("k", CUR, 1.0)];
    for _ in 0..3 {
        let reply = s
            .store
            .push("ns", push(&PushId::from("n"), 1, &d))
            .await
            .expect("no error");
        assert_eq!(reply.rejected.len(), 1, "{reply:?}");
    }
    let prev: String = ::redis::cmd("HGET")
        .arg(&hash)
        .arg(PREV)
        .query_async(&mut conn)
        .await
        .expect("read");
    assert_eq!(prev, "1", "applied once, not once per retry");
}

/// The push scripts are loaded once, not before every push; a server that lost them (a
/// restart, SCRIPT FLUSH) answers NOSCRIPT, and the push loads them again and applies
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pushes_survive_a_flushed_script_cache() {
    let s = TestStore::redis();
    let st = &s.store;
    st.push("ns", push(&PushId::from("n"), 1, &[diff("k", CUR, 1.0)]))
        .await
        .expect("push");
    let client = ::redis::Client::open(s.url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("flush");
    st.push("ns", push(&PushId::from("n"), 2, &[diff("k", CUR, 2.0)]))
        .await
        .expect("push after the flush");
    let advances = [adv("b", 1)];
    st.push_tats("ns", tat_push(Some(3), NOW_NS, &advances))
        .await
        .expect("tat push after the flush");
    assert_eq!(
        totals(st, "ns", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 3.0)]
    );
}
