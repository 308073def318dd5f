//! Strict admission's holds on every store: each store settles a hold exactly as
//! `swin_core::settle_hold` does, atomically, so concurrent holders never reserve past
//! the limit and a retried hold changes nothing.

mod common;

use std::sync::Arc;

use swin_core::{settle_hold, HoldRequest, HoldState};
use swin_sync::{Hold, Push, Store};
use swin_testkit::TestStore;

const CUR: i64 = 1_763_784_000;
const PREV: i64 = CUR - 60;

fn hold(key: &str, limit: f64, weight: f64, need: f64, want: f64) -> Hold {
    Hold {
        key: key.into(),
        window_size: 60,
        window_start: CUR,
        request: HoldRequest {
            limit,
            weight,
            need,
            want,
        },
    }
}

async fn push(store: &Store, ns: &str, key: &str, start: i64, value: f64) {
    let diffs = [swin_core::Diff {
        key: key.into(),
        window_size: 60,
        window_start: start,
        value,
    }];
    let p = Push {
        node_id: &swin_sync::PushId::new("pusher"),
        seq: None,
        diffs: &diffs,
    };
    store.push(ns, p).await.expect("push");
}

async fn current(store: &Store, ns: &str, key: &str) -> f64 {
    let w = [swin_sync::WindowKey {
        key: key.into(),
        window_size: 60,
        window_start: CUR,
    }];
    store
        .read(ns, &w)
        .await
        .expect("read")
        .first()
        .map_or(0.0, |t| t.count)
}

/// A scripted sequence of holds by two holders, with pushes between, against the core's
/// arithmetic on a model of the window.
async fn holds_settle_as_the_core_does(s: &TestStore) {
    let store = &s.store;
    push(store, "ns", "k", PREV, 40.0).await;
    push(store, "ns", "k", CUR, 10.0).await;
    let mut model = [HoldState {
        current: 10.0,
        previous: 40.0,
        held: 0.0,
    }; 2];
    let steps: &[(usize, f64, f64, f64)] = &[
        // holder, weight, need, want
        (0, 0.5, 1.0, 50.0),    // room 100 − 10 − 20 = 70: 1 + 69/4
        (0, 0.5, 1.0, 50.0),    // retried: no change
        (1, 0.5, 5.0, 100.0),   // sees holder 0's quota as used
        (0, 0.4, 30.0, 30.0),   // later in the window: more room
        (1, 0.4, 0.0, 2.0),     // gives back all but 2
        (1, 0.4, 0.0, 2.0),     // retried give-back: no change
        (0, 0.1, 500.0, 500.0), // past the limit: nothing
    ];
    for &(h, weight, need, want) in steps {
        let req = hold("k", 100.0, weight, need, want);
        let holder = ["a", "b"][h];
        let got = store
            .hold(
                "ns",
                &swin_sync::Holder::from(holder),
                std::slice::from_ref(&req),
            )
            .await
            .expect("hold");
        let other = model[1 - h];
        let before = HoldState {
            current: model[h].current.max(other.current),
            ..model[h]
        };
        let after = settle_hold(before, req.request);
        model[h] = after;
        model[1 - h].current = after.current;
        assert_eq!(got.len(), 1);
        assert!(
            (got[0].state.current - after.current).abs() < 1e-9
                && (got[0].state.held - after.held).abs() < 1e-9
                && (got[0].state.previous - 40.0).abs() < 1e-9,
            "holder {holder}, need {need}, want {want}: store {:?}, core {after:?}",
            got[0].state
        );
    }
    // the count is the pushes plus what is held
    let held: f64 = model.iter().map(|m| m.held).sum();
    assert!((current(store, "ns", "k").await - (10.0 + held)).abs() < 1e-9);
}

/// Three holders race for one window, one hit at a time: what they hold in all never
/// passes the limit, and the window's count is exactly what they hold.
async fn concurrent_holders_never_pass_the_limit(s: &TestStore) {
    let store = Arc::new(s.store.clone());
    let mut tasks = Vec::new();
    for h in 0..3 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let holder = format!("h{h}");
            let mut held = 0.0;
            for _ in 0..60 {
                let req = hold("hot", 100.0, 0.0, held + 1.0, held + 4.0);
                match store
                    .hold("ns", &swin_sync::Holder::from(holder.as_str()), &[req])
                    .await
                {
                    Ok(r) => held = r[0].state.held,
                    Err(e) => panic!("hold: {e}"),
                }
            }
            held
        }));
    }
    let mut total = 0.0;
    for t in tasks {
        total += t.await.expect("task");
    }
    assert_eq!(total, 100.0, "the holders took the whole limit, no more");
    assert_eq!(current(&store, "ns", "hot").await, 100.0);
}

/// Several windows in one call, each settled on its own.
async fn one_call_holds_many_windows(s: &TestStore) {
    let store = &s.store;
    push(store, "ns", "b", CUR, 95.0).await;
    let holds: Vec<Hold> = ["a", "b", "c"]
        .iter()
        .map(|k| hold(k, 100.0, 0.0, 10.0, 10.0))
        .collect();
    let got = store
        .hold("ns", &swin_sync::Holder::from("x"), &holds)
        .await
        .expect("hold");
    let held: Vec<f64> = got.iter().map(|h| h.state.held).collect();
    assert_eq!(held, vec![10.0, 0.0, 10.0]);
    assert_eq!(current(store, "ns", "b").await, 95.0);
    // other namespaces and holders are apart
    let other = store
        .hold("ns2", &swin_sync::Holder::from("x"), &holds[..1])
        .await
        .expect("hold");
    assert_eq!(other[0].state.current, 10.0);
}

/// A hold whose reply is lost after the store settled it, asked again (the same
/// holder, the same request): answers what one settlement leaves, and the window counts
/// the held quota once.
async fn a_hold_whose_reply_is_lost_settles_once(s: &TestStore) {
    let (store, faults) = common::faulty(&s.store);
    push(&s.store, "ns", "k", CUR, 10.0).await;
    let holder = swin_sync::Holder::from("a");
    let req = hold("k", 100.0, 0.0, 5.0, 20.0);
    faults.plan([swin_sync::store::Fault::FailAfter]);
    let lost = store.hold("ns", &holder, std::slice::from_ref(&req)).await;
    assert!(lost.is_err(), "the reply lost: {lost:?}");
    let again = store
        .hold("ns", &holder, std::slice::from_ref(&req))
        .await
        .expect("again");
    let once = settle_hold(
        HoldState {
            current: 10.0,
            previous: 0.0,
            held: 0.0,
        },
        req.request,
    );
    assert!(
        (again[0].state.held - once.held).abs() < 1e-9,
        "{again:?} {once:?}"
    );
    assert!((current(&s.store, "ns", "k").await - (10.0 + once.held)).abs() < 1e-9);
}

/// Fractional counts go into the store and come back bit for bit: each window holds what
/// the core settles, and a hold asked again finds exactly that (a count read back from
/// text one unit in the last place off would make the retry give quota back).
async fn fractional_holds_keep_every_bit(s: &TestStore) {
    let store = &s.store;
    let holder = swin_sync::Holder::from("x");
    // fractions of every size, as a seeded generator gives them
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut values = vec![26.74998368597692, 0.1, 1.0 / 3.0, 1e-9];
    for _ in 0..60 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        values.push((x >> 11) as f64 / (1u64 << 53) as f64 * 1_000.0);
    }
    let holds: Vec<Hold> = values
        .iter()
        .enumerate()
        .map(|(i, v)| hold(&format!("f{i}"), 1e6, 0.0, *v, *v))
        .collect();
    let first = store.hold("ns", &holder, &holds).await.expect("hold");
    let again = store.hold("ns", &holder, &holds).await.expect("hold again");
    for (i, v) in values.iter().enumerate() {
        let empty = HoldState {
            current: 0.0,
            previous: 0.0,
            held: 0.0,
        };
        let want = settle_hold(empty, holds[i].request);
        assert_eq!(first[i].state, want, "{v}");
        assert_eq!(again[i].state, want, "asked again: {v}");
        let stored = current(store, "ns", &format!("f{i}")).await;
        assert_eq!(stored.to_bits(), v.to_bits(), "{v} stored as {stored}");
    }
}

/// One holder's holds of one window racing each other (a commit's give-back and the
/// engine's return of an ended window): each settles against what the holder holds as
/// the one before it left it, so the window counts exactly what the holder holds after
/// both, whichever landed last. (PostgreSQL read the holder's hold as the statement
/// began, before the other's commit it waited for: the count went to what one hold
/// left less what the other had taken back — 0 where 47 was held.)
async fn one_holders_racing_holds_leave_the_count_exact(s: &TestStore) {
    let store = &s.store;
    let holder = swin_sync::Holder::from("a");
    for round in 0..30 {
        let key = format!("race{round}");
        let h = |want: f64| hold(&key, 1_000.0, 0.0, 0.0, want);
        store
            .hold("ns", &holder, &[hold(&key, 1_000.0, 0.0, 107.0, 107.0)])
            .await
            .expect("hold");
        let (one, other) = ([h(47.0)], [h(60.0)]);
        let (a, b) = tokio::join!(
            store.hold("ns", &holder, &one),
            store.hold("ns", &holder, &other)
        );
        a.expect("hold");
        b.expect("hold");
        let last = store.hold("ns", &holder, &[h(10.0)]).await.expect("hold");
        assert_eq!(last[0].state.held, 10.0, "round {round}: {last:?}");
        assert_eq!(
            (last[0].state.current, current(store, "ns", &key).await),
            (10.0, 10.0),
            "round {round}: the window counts what its one holder holds"
        );
    }
}

/// A push that adds to one window and gives back on another, racing a hold of both:
/// neither fails, and each window counts the push and the hold exactly. (PostgreSQL's
/// push locked the rows it added to before those it gave back on, each in key order —
/// two passes — while a hold locks all of its rows in one: a push adding to `b` and
/// giving back on `a` and a hold of `a` then `b` deadlocked, and the store aborted one
/// of them a second later.)
async fn a_push_that_gives_back_never_deadlocks_a_hold(s: &TestStore) {
    let store = &s.store;
    let holder = swin_sync::Holder::from("h");
    for round in 0..150 {
        let (a, b) = (format!("dl{round}a"), format!("dl{round}b"));
        push(store, "ns", &a, CUR, 5.0).await;
        push(store, "ns", &b, CUR, 5.0).await;
        let diffs = [
            swin_core::Diff {
                key: a.as_str().into(),
                window_size: 60,
                window_start: CUR,
                value: -1.0,
            },
            swin_core::Diff {
                key: b.as_str().into(),
                window_size: 60,
                window_start: CUR,
                value: 1.0,
            },
        ];
        let node = swin_sync::PushId::new("pusher");
        let p = Push {
            node_id: &node,
            seq: None,
            diffs: &diffs,
        };
        let holds = [
            hold(&a, 1_000.0, 0.0, 1.0, 1.0),
            hold(&b, 1_000.0, 0.0, 1.0, 1.0),
        ];
        let (pushed, held) = tokio::join!(store.push("ns", p), store.hold("ns", &holder, &holds));
        pushed.unwrap_or_else(|e| panic!("round {round}: the push failed: {e}"));
        let held = held.unwrap_or_else(|e| panic!("round {round}: the hold failed: {e}"));
        assert!(
            held.iter().all(|h| h.state.held == 1.0),
            "round {round}: {held:?}"
        );
        assert_eq!(
            (
                current(store, "ns", &a).await,
                current(store, "ns", &b).await
            ),
            (5.0, 7.0),
            "round {round}: 5 - 1 + a hold of 1, and 5 + 1 + a hold of 1"
        );
    }
}

swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite, valkey, redis8] [
    a_push_that_gives_back_never_deadlocks_a_hold,
    one_holders_racing_holds_leave_the_count_exact,
    a_hold_whose_reply_is_lost_settles_once,
    holds_settle_as_the_core_does,
    concurrent_holders_never_pass_the_limit,
    one_call_holds_many_windows,
    fractional_holds_keep_every_bit
]);

/// Redis keeps holders' totals as fields of the window's hash: when a window opens (by a
/// hold or by a push), the window before the previous goes with every holder's total in
/// it — also those of holders that died and never gave back — so a hot key's hash, whose
/// TTL keeps being refreshed, does not gather them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_drops_the_totals_of_windows_two_back() {
    let s = TestStore::redis();
    let store = &s.store;
    let old = |start: i64, holder: &'static str| async move {
        let mut h = hold("k", 100.0, 0.0, 1.0, 1.0);
        h.window_start = start;
        store
            .hold("ns", &swin_sync::Holder::from(holder), &[h])
            .await
            .expect("hold");
    };
    old(CUR - 120, "dead").await;
    old(CUR - 60, "alive").await;
    let Store::Redis(redis_store) = store else {
        panic!("a Redis store")
    };
    let prefix = redis_store.prefix().to_owned();
    let fields = || async {
        let client = ::redis::Client::open(s.url.as_str()).expect("url");
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("{prefix}:*"))
            .query_async(&mut c)
            .await
            .expect("keys");
        let mut all: Vec<String> = Vec::new();
        for k in keys {
            let f: Vec<String> = ::redis::cmd("HKEYS")
                .arg(&k)
                .query_async(&mut c)
                .await
                .expect("hkeys");
            all.extend(f);
        }
        all.sort();
        all
    };
    assert!(fields().await.contains(&format!("h:{}:dead", CUR - 120)));
    // a hold opens the current window: the one two back goes, with the dead holder's total
    store
        .hold(
            "ns",
            &swin_sync::Holder::from("live"),
            &[hold("k", 100.0, 0.0, 1.0, 1.0)],
        )
        .await
        .expect("hold");
    let after = fields().await;
    assert!(
        !after
            .iter()
            .any(|f| f.starts_with(&format!("h:{}:", CUR - 120))),
        "{after:?}"
    );
    assert!(
        after.contains(&format!("h:{}:alive", CUR - 60)),
        "{after:?}"
    );
    // and a push that opens the next window drops the previous one's totals in turn
    let diffs = [swin_core::Diff {
        key: "k".into(),
        window_size: 60,
        window_start: CUR + 60,
        value: 1.0,
    }];
    let p = Push {
        node_id: &swin_sync::PushId::new("n"),
        seq: None,
        diffs: &diffs,
    };
    store.push("ns", p).await.expect("push");
    let after = fields().await;
    assert!(
        !after
            .iter()
            .any(|f| f.starts_with(&format!("h:{}:", CUR - 60))),
        "{after:?}"
    );
}
