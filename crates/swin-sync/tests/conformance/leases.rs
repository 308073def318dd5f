//! Concurrency leases: never more slots in flight than the limit, whatever races; a
//! lease ends once (release, lapse), renews only while live, and a retried acquire of
//! the same lease replaces it; every change sent again after a lost reply applies once.

use swin_core::UnixMs;
use swin_sync::store::{new_op, Acquire, Fault, Released};
use swin_testkit::TestStore;

/// A deadline no change here reaches.
const LATER: UnixMs = UnixMs(i64::MAX);

fn acquire<'a>(key: &'a str, lease: &'a str, count: u32, now: i64, ttl: i64) -> Acquire<'a> {
    Acquire {
        key,
        lease,
        count,
        limit: 3,
        expires_at: UnixMs(now + ttl),
        now: UnixMs(now),
    }
}

pub async fn leases_never_pass_the_limit_under_racing_acquires(s: &TestStore) {
    let now = 1_800_000_000_000;
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let store = s.store.clone();
            tokio::spawn(async move {
                let lease = format!("l{i}");
                let a = acquire("k", &lease, 1, now, 30_000);
                (
                    lease.clone(),
                    store.acquire("ns", a, LATER).await.expect("acquire"),
                )
            })
        })
        .collect();
    let mut granted = Vec::new();
    for t in tasks {
        let (lease, a) = t.await.expect("task");
        assert!(a.in_flight <= 3, "{a:?}");
        if a.granted {
            granted.push(lease);
        } else {
            assert_eq!(a.in_flight, 3, "denied only when full: {a:?}");
            assert_eq!(a.earliest_lapse, Some(UnixMs(now + 30_000)));
        }
    }
    assert_eq!(granted.len(), 3, "{granted:?}");
    // a count of 2 does not fit in what is left; another key is apart
    let big = s
        .store
        .acquire("ns", acquire("k", "big", 2, now, 30_000), LATER)
        .await
        .expect("big");
    assert!(!big.granted);
    let other = s
        .store
        .acquire("ns", acquire("other", "o", 3, now, 30_000), LATER)
        .await
        .expect("other");
    assert!(other.granted && other.in_flight == 3, "{other:?}");
    let other_ns = s
        .store
        .acquire("ns2", acquire("k", "x", 3, now, 30_000), LATER)
        .await
        .expect("ns2");
    assert!(other_ns.granted, "another namespace is apart");
    // released once: a slot is free at once; twice: told it was ended before
    let st = &s.store;
    let release = |lease: &str| {
        let lease = lease.to_owned();
        async move {
            st.release("ns", "k", &lease, &new_op(), UnixMs(now + 1), LATER)
                .await
                .expect("release")
        }
    };
    assert_eq!(release(&granted[0]).await, Released::Now);
    // another release of it: told it was ended, nothing changed
    assert_eq!(release(&granted[0]).await, Released::Before, "again");
    assert_eq!(release("never").await, Released::NotLive, "unknown");
    let next = st
        .acquire("ns", acquire("k", "next", 1, now + 2, 30_000), LATER)
        .await
        .expect("next");
    assert!(next.granted && next.in_flight == 3, "{next:?}");
    // a retried acquire of a lease it holds replaces it, not adds
    let again = st
        .acquire("ns", acquire("k", "next", 1, now + 3, 30_000), LATER)
        .await
        .expect("retry");
    assert!(again.granted && again.in_flight == 3, "{again:?}");
}

pub async fn leases_lapse_and_renew_only_while_live(s: &TestStore) {
    let st = &s.store;
    let t = 1_800_000_000_000;
    // limit 3, a lease of 3 until t + 1000
    let a = st
        .acquire("ns", acquire("k", "a", 3, t, 1_000), LATER)
        .await
        .expect("a");
    assert!(a.granted);
    let b = st
        .acquire("ns", acquire("k", "b", 1, t + 500, 1_000), LATER)
        .await
        .expect("b");
    assert!(
        !b.granted && b.earliest_lapse == Some(UnixMs(t + 1_000)),
        "{b:?}"
    );
    // renewed while live: holds past its first lapse
    assert!(st
        .renew("ns", "k", "a", UnixMs(t + 5_000), UnixMs(t + 900), LATER)
        .await
        .expect("renew"));
    let c = st
        .acquire("ns", acquire("k", "c", 1, t + 2_000, 1_000), LATER)
        .await
        .expect("c");
    assert!(!c.granted, "a renewed lease still counts: {c:?}");
    // lapsed: no longer counts, cannot be released or renewed
    let d = st
        .acquire("ns", acquire("k", "d", 2, t + 5_000, 1_000), LATER)
        .await
        .expect("d");
    assert!(d.granted && d.in_flight == 2, "{d:?}");
    let op = new_op();
    let r = st.release("ns", "k", "a", &op, UnixMs(t + 5_001), LATER);
    assert_eq!(r.await.expect("lapsed release"), Released::NotLive);
    assert!(!st
        .renew("ns", "k", "a", UnixMs(t + 9_000), UnixMs(t + 5_001), LATER)
        .await
        .expect("lapsed renew"));
    let e = st
        .acquire("ns", acquire("k", "e", 2, t + 5_002, 1_000), LATER)
        .await
        .expect("e");
    assert!(!e.granted && e.in_flight == 2, "{e:?}");
}

pub async fn slots_released_by_prefix_end_the_earliest_first(s: &TestStore) {
    let st = &s.store;
    let t = 1_800_000_000_000;
    let big = |key, lease, count, ttl| Acquire {
        limit: 10,
        ..acquire(key, lease, count, t, ttl)
    };
    // envoy.a: 2 slots lapsing first, envoy.b: 3, then envoy.c (lapsed by t + 10),
    // and "mine", another door's lease, that a release by prefix never touches
    for (lease, count, ttl) in [
        ("envoy.b", 3, 2_000),
        ("envoy.a", 2, 1_000),
        ("mine", 1, 500),
        ("envoy.c", 1, 10),
    ] {
        let a = st.acquire("ns", big("k", lease, count, ttl), LATER).await;
        assert!(a.expect("acquire").granted);
    }
    let now = UnixMs(t + 100);
    // 3 slots: envoy.a whole (2), then one of envoy.b's 3 (it keeps 2)
    assert_eq!(
        st.release_slots("ns", "k", "envoy.", 3, now, LATER)
            .await
            .expect("release"),
        3
    );
    assert_eq!(
        st.release("ns", "k", "envoy.a", &new_op(), now, LATER)
            .await
            .expect("a"),
        Released::NotLive,
        "envoy.a ended whole"
    );
    let full = st
        .acquire(
            "ns",
            Acquire {
                now,
                ..big("k", "probe", 8, 1_000)
            },
            LATER,
        )
        .await
        .expect("probe");
    assert!(
        !full.granted && full.in_flight == 3,
        "envoy.b keeps 2, mine 1: {full:?}"
    );
    // more than is left: what is left (2), never the other door's lease
    assert_eq!(
        st.release_slots("ns", "k", "envoy.", 5, now, LATER)
            .await
            .expect("rest"),
        2
    );
    assert_eq!(
        st.release_slots("ns", "k", "envoy.", 1, now, LATER)
            .await
            .expect("none"),
        0
    );
    let op = new_op();
    let r = st.release("ns", "k", "mine", &op, now, LATER);
    assert_eq!(r.await.expect("mine still live"), Released::Now);
    // another key and namespace are apart
    assert!(
        st.acquire("ns", big("other", "envoy.o", 1, 1_000), LATER)
            .await
            .expect("other")
            .granted
    );
    assert_eq!(
        st.release_slots("ns2", "other", "envoy.", 1, now, LATER)
            .await
            .expect("ns2"),
        0
    );
    assert_eq!(
        st.release_slots("ns", "other", "envoy.", 1, now, LATER)
            .await
            .expect("other"),
        1
    );
}

/// What an operator reads as a namespace's slots in flight: the live leases of every
/// key of that namespace only — not a lapsed one, not another namespace's (a name with
/// SCAN's glob characters matches itself alone), and less what a release ended.
pub async fn leases_in_flight_count_the_live_slots_of_one_namespace(s: &TestStore) {
    let st = &s.store;
    let t = 1_800_000_000_000;
    let take = |key, lease, count, ttl| Acquire {
        limit: 10,
        ..acquire(key, lease, count, t, ttl)
    };
    for (ns, key, lease, count, ttl) in [
        ("a*", "k1", "l1", 2, 1_000),
        ("a*", "k2", "l2", 3, 1_000),
        ("a*", "k2", "short", 4, 10),
        ("ab", "k1", "l1", 5, 1_000),
        ("a", "k1", "l1", 1, 1_000),
    ] {
        let a = st.acquire(ns, take(key, lease, count, ttl), LATER).await;
        assert!(a.expect("acquire").granted, "{ns} {key} {lease}");
    }
    let now = UnixMs(t + 100);
    let in_flight = async |ns| st.in_flight(ns, now).await.expect("in flight");
    assert_eq!(in_flight("a*").await, 5, "the lapsed 4 no longer count");
    assert_eq!(in_flight("ab").await, 5);
    assert_eq!(in_flight("a").await, 1);
    assert_eq!(in_flight("none").await, 0);
    let op = new_op();
    let r = st.release("a*", "k2", "l2", &op, now, LATER);
    assert_eq!(r.await.expect("release"), Released::Now);
    assert_eq!(in_flight("a*").await, 2);
    assert_eq!(in_flight("a*").await, 2);
    // every lease lapsed
    assert_eq!(
        st.in_flight("a*", UnixMs(t + 1_000))
            .await
            .expect("in flight"),
        0
    );
}

/// A release, renewal or end of slots the store takes after its deadline (by its own
/// clock) changes nothing and says so: its caller stopped waiting and told its client
/// nothing changed.
pub async fn a_lease_change_past_its_deadline_changes_nothing(s: &TestStore) {
    let st = &s.store;
    let now = swin_sync::now().0;
    let past = UnixMs(now - 60_000);
    for lease in ["a", "envoy.b"] {
        let a = st
            .acquire("ns", acquire("k", lease, 1, now, 60_000), LATER)
            .await
            .expect("acquire");
        assert!(a.granted);
    }
    let late = |r: Result<bool, swin_sync::StoreError>| {
        assert!(matches!(r, Err(swin_sync::StoreError::TooLate)), "{r:?}")
    };
    let op = new_op();
    let r = st.release("ns", "k", "a", &op, UnixMs(now), past).await;
    assert!(matches!(r, Err(swin_sync::StoreError::TooLate)), "{r:?}");
    late(
        st.renew("ns", "k", "a", UnixMs(now + 1), UnixMs(now), past)
            .await,
    );
    let r = st
        .release_slots("ns", "k", "envoy.", 1, UnixMs(now), past)
        .await;
    assert!(matches!(r, Err(swin_sync::StoreError::TooLate)), "{r:?}");
    let r = st
        .acquire("ns", acquire("k", "late", 1, now, 60_000), past)
        .await;
    assert!(matches!(r, Err(swin_sync::StoreError::TooLate)), "{r:?}");
    // both leases still live, as acquired
    assert_eq!(st.in_flight("ns", UnixMs(now + 1)).await.expect("count"), 2);
    let full = st
        .acquire("ns", acquire("k", "c", 2, now, 60_000), LATER)
        .await
        .expect("acquire");
    assert!(!full.granted, "two held of three: {full:?}");
    let op = new_op();
    let r = st.release("ns", "k", "a", &op, UnixMs(now), LATER);
    assert_eq!(r.await.expect("release"), Released::Now);
}

/// Every lease change whose reply is lost (the store applied it) and which is sent
/// again answers what the first did, changing nothing more: an acquire (the same lease
/// replaces itself: its slots count once), a renewal (to the same lapse), a release
/// (under the same operation id: ended now; under another: ended before). An acquire of
/// the lease again makes it live: its earlier end is forgotten.
pub async fn a_lease_change_retried_after_a_lost_reply_applies_once(s: &TestStore) {
    let (st, faults) = crate::common::faulty(&s.store);
    let now = 1_800_000_000_000;
    let take = || st.acquire("ns", acquire("k", "lost", 2, now, 10_000), LATER);
    faults.plan([Fault::FailAfter]);
    take().await.expect_err("the reply lost");
    let a = take().await.expect("again");
    assert_eq!((a.granted, a.in_flight), (true, 2), "counted once: {a:?}");
    let other = st.acquire("ns", acquire("k", "other", 2, now, 10_000), LATER);
    assert!(!other.await.expect("other").granted, "two of three held");

    let renew = || {
        st.renew(
            "ns",
            "k",
            "lost",
            UnixMs(now + 60_000),
            UnixMs(now + 1),
            LATER,
        )
    };
    faults.plan([Fault::FailAfter]);
    renew().await.expect_err("the reply lost");
    assert!(
        renew().await.expect("again"),
        "still live: renewed to the same lapse"
    );
    let past_first_lapse = UnixMs(now + 20_000);
    let held = s.store.in_flight("ns", past_first_lapse).await;
    assert_eq!(held.expect("count"), 2, "renewed past its first lapse");

    let op = new_op();
    let release = |op: &str| {
        let op = op.to_owned();
        let st = st.clone();
        async move {
            st.release("ns", "k", "lost", &op, UnixMs(now + 2), LATER)
                .await
        }
    };
    faults.plan([Fault::FailAfter]);
    release(&op).await.expect_err("the reply lost");
    assert_eq!(release(&op).await.expect("again"), Released::Now, "its own");
    assert_eq!(
        release(&new_op()).await.expect("another"),
        Released::Before,
        "a release sent again by its client"
    );
    let held = s.store.in_flight("ns", UnixMs(now + 3)).await;
    assert_eq!(held.expect("count"), 0, "released once");

    // acquired again, the lease is live; lapsed, it is not live (not "ended before")
    let short = acquire("k", "lost", 1, now + 4, 1_000);
    assert!(st.acquire("ns", short, LATER).await.expect("again").granted);
    let op = new_op();
    let lapsed = st.release("ns", "k", "lost", &op, UnixMs(now + 2_000), LATER);
    assert_eq!(lapsed.await.expect("lapsed"), Released::NotLive);
}
