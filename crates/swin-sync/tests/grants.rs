//! Strict admission of GCRA buckets on every store: each store settles a reservation
//! exactly as `swin_core::settle_grant` does, atomically, so concurrent holders never
//! reserve past the bucket, and a repeated reservation number changes nothing.

mod common;

use std::sync::Arc;

use swin_core::{settle_grant, Advance, GrantRequest, GrantState};
use swin_sync::{Grant, Store, TatPush};
use swin_testkit::TestStore;

const S: i64 = 1_000_000_000;
const MS: i64 = 1_000_000;
/// Late 2025, in nanoseconds: TATs as the nodes write them (beyond 2^53).
const T0: i64 = 1_763_784_000 * S;

/// A bucket of 10 units refilled at one per 100 ms; grants may be spent for 50 ms.
fn grant(key: &str, seq: i64, now_ns: i64, need: i64, want: i64) -> Grant {
    Grant {
        key: key.into(),
        request: GrantRequest {
            seq,
            now_ns,
            horizon_ns: 50 * MS,
            emission_ns: 100 * MS,
            burst: 10,
            need,
            want,
        },
    }
}

async fn tat(store: &Store, ns: &str, key: &str) -> Option<i64> {
    let t = store.read_tats(ns, &[key.into()]).await.expect("read");
    t.first().map(|t| t.tat_ns)
}

/// A scripted sequence of reservations by two holders, with a pushed advance between,
/// against the core's arithmetic on a model of the bucket.
async fn reservations_settle_as_the_core_does(s: &TestStore) {
    let store = &s.store;
    let mut bucket: Option<i64> = None;
    let mut last: [Option<(i64, i64)>; 2] = [None, None];
    let steps: &[(usize, i64, i64, i64, i64)] = &[
        // holder, seq, now (ms after T0), need, want
        (0, 1, 0, 1, 100),   // room 10: 1 + ⌊9/4⌋
        (0, 1, 0, 1, 100),   // repeated: the same answer, no change
        (1, 1, 5, 3, 3),     // sees holder 0's units as spent
        (0, 2, 10, 8, 8),    // more than is left: nothing
        (1, 2, 400, 2, 20),  // later: room again
        (0, 2, 10, 8, 8),    // a repeat of a denial: still nothing
        (0, 3, 5_000, 1, 1), // the bucket is full again
    ];
    for &(h, seq, at, need, want) in steps {
        let r = grant("k", seq, T0 + at * MS, need, want);
        let holder = ["a", "b"][h];
        let got = store
            .grant(
                "ns",
                &swin_sync::Holder::from(holder),
                std::slice::from_ref(&r),
            )
            .await
            .expect("grant");
        let out = settle_grant(
            GrantState {
                tat_ns: bucket,
                last: last[h],
            },
            r.request,
        );
        bucket = out.state.tat_ns;
        last[h] = out.state.last;
        assert_eq!(got.len(), 1);
        assert_eq!(
            (got[0].granted, got[0].tat_ns.filter(|&t| t > 0)),
            (out.granted, bucket),
            "holder {holder}, seq {seq}, at {at} ms"
        );
    }
    assert_eq!(tat(store, "ns", "k").await, bucket);
    // a pushed advance (an eventual-mode spend) counts against the next reservation
    let advances = [Advance {
        key: "k".into(),
        ns: 10 * 100 * MS,
    }];
    let now = T0 + 5_000 * MS;
    let push = TatPush {
        node_id: &swin_sync::PushId::new("n"),
        seq: None,
        now_ns: now,
        advances: &advances,
    };
    store.push_tats("ns", push).await.expect("push");
    let got = store
        .grant(
            "ns",
            &swin_sync::Holder::from("a"),
            &[grant("k", 4, now, 1, 1)],
        )
        .await
        .expect("grant");
    assert_eq!(got[0].granted, 0, "the push spent the whole burst");
}

/// Three holders race for one bucket, one unit at a time at the same instant: they are
/// granted the burst less what the horizon takes (50 ms of 100 ms: one unit, rounded
/// down), no more, and the TAT shows every unit.
async fn concurrent_holders_never_pass_the_burst(s: &TestStore) {
    let store = Arc::new(s.store.clone());
    let mut tasks = Vec::new();
    for h in 0..3 {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let holder = format!("h{h}");
            let mut granted = 0;
            for seq in 0..20 {
                let r = grant("hot", seq, T0, 1, 1);
                granted += store
                    .grant("ns", &swin_sync::Holder::from(holder.as_str()), &[r])
                    .await
                    .expect("grant")[0]
                    .granted;
            }
            granted
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("task");
    }
    assert_eq!(total, 9, "the holders took the burst, no more");
    assert_eq!(
        tat(&store, "ns", "hot").await,
        Some(T0 + 50 * MS + 9 * 100 * MS)
    );
}

/// Several buckets in one call, each settled on its own; namespaces and holders apart.
async fn one_call_grants_many_buckets(s: &TestStore) {
    let store = &s.store;
    let advances = [Advance {
        key: "b".into(),
        ns: 10 * 100 * MS,
    }];
    let push = TatPush {
        node_id: &swin_sync::PushId::new("n"),
        seq: None,
        now_ns: T0,
        advances: &advances,
    };
    store.push_tats("ns", push).await.expect("push");
    let grants: Vec<Grant> = ["a", "b", "c", "a"]
        .iter()
        .enumerate()
        .map(|(i, k)| grant(k, 1 + i as i64, T0, 2, 2))
        .collect();
    let got = store
        .grant("ns", &swin_sync::Holder::from("x"), &grants)
        .await
        .expect("grant");
    let granted: Vec<i64> = got.iter().map(|g| g.granted).collect();
    // the second reservation of "a" has a new number: granted again
    assert_eq!(granted, vec![2, 0, 2, 2]);
    assert_eq!(got[3].tat_ns, Some(T0 + 50 * MS + 4 * 100 * MS));
    let other = store
        .grant("ns2", &swin_sync::Holder::from("x"), &grants[..1])
        .await
        .expect("grant");
    assert_eq!(other[0].granted, 2);
    // a reset forgets the bucket and the holder's records
    store.reset("ns", "a", &[]).await.expect("reset");
    assert_eq!(tat(store, "ns", "a").await.filter(|&t| t > 0), None);
    let again = store
        .grant("ns", &swin_sync::Holder::from("x"), &grants[..1])
        .await
        .expect("grant");
    assert_eq!(again[0].granted, 2, "after a reset, a number is new again");
}

/// A grant whose reply is lost after the store settled it, asked again under the same
/// request number: answers the first grant, and the bucket's TAT moved once.
async fn a_grant_whose_reply_is_lost_settles_once(s: &TestStore) {
    let (store, faults) = common::faulty(&s.store);
    let holder = swin_sync::Holder::from("a");
    let req = grant("k", 1, T0, 2, 4);
    faults.plan([swin_sync::store::Fault::FailAfter]);
    let lost = store.grant("ns", &holder, std::slice::from_ref(&req)).await;
    assert!(lost.is_err(), "the reply lost: {lost:?}");
    let again = store
        .grant("ns", &holder, std::slice::from_ref(&req))
        .await
        .expect("again");
    let once = settle_grant(
        GrantState {
            tat_ns: None,
            last: None,
        },
        req.request,
    );
    assert_eq!(again[0].granted, once.granted, "{again:?}");
    assert_eq!(
        tat(&s.store, "ns", "k").await,
        once.state.tat_ns,
        "moved once"
    );
}

/// A reservation and its retry racing it (the first's answer late, not lost): one
/// settlement — both answer the same grant and the bucket spends it once. (PostgreSQL
/// read the holder's last reservation as the statement began, before the first's commit
/// it waited for, and granted the retry again.)
async fn a_reservation_racing_its_retry_settles_once(s: &TestStore) {
    let store = &s.store;
    let holder = swin_sync::Holder::from("a");
    for round in 0..30 {
        let key = format!("race{round}");
        // the bucket's row is there before the race
        store
            .grant("ns", &holder, &[grant(&key, 6, T0, 1, 1)])
            .await
            .expect("grant");
        let one = [grant(&key, 7, T0, 2, 2)];
        let (a, b) = tokio::join!(
            store.grant("ns", &holder, &one),
            store.grant("ns", &holder, &one)
        );
        let (a, b) = (a.expect("grant"), b.expect("grant"));
        assert_eq!((a[0].granted, b[0].granted), (2, 2), "round {round}");
        assert_eq!(
            tat(store, "ns", &key).await,
            Some(T0 + 50 * MS + 3 * 100 * MS),
            "round {round}: the bucket spent the grant once"
        );
    }
}

swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite, valkey, redis8] [
    a_reservation_racing_its_retry_settles_once,
    a_grant_whose_reply_is_lost_settles_once,
    reservations_settle_as_the_core_does,
    concurrent_holders_never_pass_the_burst,
    one_call_grants_many_buckets
]);
