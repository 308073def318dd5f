//! Reservations of a cost: a record is taken exactly once whatever races, an extend
//! raises it only while it is open, a lapsed record answers nothing, a change past its
//! deadline changes nothing, the open ones of a namespace are counted, and every change
//! applied again with its operation id (its reply lost) changes nothing more.

use swin_core::UnixMs;
use swin_sync::store::{
    extend_op, new_op, Ended, Fault, OpenReservation, Opening, ReservationRecord, OPS_KEPT,
};
use swin_sync::StoreError;
use swin_testkit::TestStore;

/// A deadline no change here reaches.
const LATER: UnixMs = UnixMs(i64::MAX);
const NOW: i64 = 1_800_000_000_000;

fn keys() -> Vec<String> {
    vec!["tenant:acme".into(), "user:7 ✓".into()]
}

async fn open(s: &TestStore, ns: &str, id: &str, total: f64, ttl: i64) -> bool {
    let keys = keys();
    let o = OpenReservation {
        id,
        keys: &keys,
        total,
        expires_at: UnixMs(NOW + ttl),
        now: UnixMs(NOW),
        at: UnixMs(NOW - 5),
        client: "",
        max_open: None,
        max_open_per_client: None,
    };
    s.store.open_reservation(ns, o).await.expect("open").opening == Opening::Open
}

/// Opens `id` over other keys than [`keys`].
async fn open_other(s: &TestStore, ns: &str, id: &str) -> bool {
    let keys = vec!["someone else".to_owned()];
    let o = OpenReservation {
        id,
        keys: &keys,
        total: 9.0,
        expires_at: UnixMs(NOW + 30_000),
        now: UnixMs(NOW),
        at: UnixMs(NOW),
        client: "",
        max_open: None,
        max_open_per_client: None,
    };
    s.store.open_reservation(ns, o).await.expect("open").opening == Opening::Open
}

/// Extends `id` by `more` as `op`, counted and asked at `at`.
async fn extend(
    s: &TestStore,
    id: &str,
    op: &str,
    more: f64,
    at: i64,
) -> Option<ReservationRecord> {
    s.store
        .extend_reservation("ns", id, op, more, UnixMs(at), UnixMs(at), LATER)
        .await
        .expect("extend")
}

/// Ends `id` as `op` at `cost`, at `at`.
async fn take(s: &TestStore, id: &str, op: &str, cost: f64, at: i64) -> Option<ReservationRecord> {
    s.store
        .take_reservation("ns", id, op, cost, UnixMs(at), LATER)
        .await
        .expect("take")
}

pub async fn a_reservation_is_taken_exactly_once_under_racing_commits(s: &TestStore) {
    assert!(open(s, "ns", "r1", 4.0, 30_000).await);
    assert!(
        open(s, "ns", "r1", 4.0, 30_000).await,
        "an opening retried finds its own record"
    );
    assert!(
        !open_other(s, "ns", "r1").await,
        "a live id is not written over"
    );
    let read = s
        .store
        .read_reservation("ns", "r1", UnixMs(NOW))
        .await
        .expect("read");
    let want = ReservationRecord {
        keys: keys(),
        total: 4.0,
        expires_at: UnixMs(NOW + 30_000),
        counted: vec![(UnixMs(NOW - 5), 4.0)],
        ended: None,
        extends: Vec::new(),
    };
    assert_eq!(read.as_ref(), Some(&want));
    let ops: Vec<String> = (0..16).map(|_| new_op()).collect();
    let tasks: Vec<_> = ops
        .iter()
        .enumerate()
        .map(|(i, op)| {
            let (store, op) = (s.store.clone(), op.clone());
            tokio::spawn(async move {
                store
                    .take_reservation("ns", "r1", &op, i as f64, UnixMs(NOW + 1), LATER)
                    .await
                    .expect("take")
                    .expect("a record")
            })
        })
        .collect();
    let mut ended = Vec::new();
    for t in tasks {
        ended.push(t.await.expect("task").ended.expect("ended"));
    }
    let first = ended[0].clone();
    assert!(
        ended.iter().all(|e| *e == first),
        "one commit ended it: {ended:?}"
    );
    let winner = ops
        .iter()
        .position(|o| *o == first.op)
        .expect("one of them");
    assert_eq!(first.cost, winner as f64, "at the winner's cost");
    // the winner asking again gets it again, ended by itself; the record stays, ended
    let again = take(s, "r1", &first.op, 99.0, NOW + 2)
        .await
        .expect("record");
    assert_eq!((again.total, again.keys.clone()), (4.0, keys()));
    assert_eq!(again.ended, Some(first.clone()));
    let read = s.store.read_reservation("ns", "r1", UnixMs(NOW + 3)).await;
    assert_eq!(read.expect("read").and_then(|r| r.ended), Some(first));
    assert!(
        !open(s, "ns", "r1", 4.0, 30_000).await,
        "an ended record is not opened again"
    );
    // another namespace never held it
    assert!(open(s, "other", "r2", 1.0, 30_000).await);
    assert_eq!(take(s, "r2", &new_op(), 1.0, NOW).await, None);
}

pub async fn an_extend_raises_an_open_reservation_only(s: &TestStore) {
    assert!(open(s, "ns", "x", 2.0, 1_000).await);
    let first = new_op();
    let after = extend(s, "x", &first, 3.5, NOW + 10).await.expect("open");
    assert_eq!(after.total, 5.5);
    let again = extend(s, "x", &first, 3.5, NOW + 15).await.expect("open");
    assert_eq!(again, after, "the same extend again changes nothing");
    let after = extend(s, "x", &new_op(), 0.25, NOW + 20)
        .await
        .expect("open");
    assert_eq!((after.total, after.keys.clone()), (5.75, keys()));
    let counted = [(NOW - 5, 2.0), (NOW + 10, 3.5), (NOW + 20, 0.25)];
    let counted: Vec<_> = counted.iter().map(|&(t, v)| (UnixMs(t), v)).collect();
    assert_eq!(after.counted, counted, "where each take was counted");
    // past its lapse: nothing, and nothing changes
    assert_eq!(extend(s, "x", &new_op(), 1.0, NOW + 1_000).await, None);
    assert_eq!(take(s, "x", &new_op(), 1.0, NOW + 1_000).await, None);
    // ended: a new extend finds nothing; one it held before still answers
    assert!(open(s, "ns", "y", 1.0, 30_000).await);
    let before = new_op();
    extend(s, "y", &before, 2.0, NOW).await.expect("open");
    let ended = take(s, "y", &new_op(), 1.0, NOW).await.expect("record");
    assert!(ended.ended.is_some());
    assert_eq!(extend(s, "y", &new_op(), 1.0, NOW).await, None);
    let held = extend(s, "y", &before, 2.0, NOW)
        .await
        .expect("it holds the op");
    assert_eq!(held.total, 3.0, "nothing raised again");
}

/// An extend is applied once per identity, whichever request sends it (a retry under
/// the same idempotency key on another node is another request with the same
/// identity), and the record says which request applied it, for the latest
/// `OPS_KEPT` extends.
pub async fn an_extend_is_applied_once_per_identity_and_says_by_whom(s: &TestStore) {
    assert!(open(s, "ns", "i", 1.0, 30_000).await);
    let (identity, first, retry) = (new_op(), new_op(), new_op());
    let by_first = extend_op(&identity, &first);
    let after = extend(s, "i", &by_first, 2.0, NOW).await.expect("open");
    assert_eq!(after.total, 3.0);
    assert_eq!(after.applied_by(&identity), Some(first.as_str()));
    let again = extend(s, "i", &extend_op(&identity, &retry), 2.0, NOW + 1)
        .await
        .expect("open");
    assert_eq!(again.total, 3.0, "the same identity is not applied twice");
    assert_eq!(
        again.applied_by(&identity),
        Some(first.as_str()),
        "by the first"
    );
    let read = s
        .store
        .read_reservation("ns", "i", UnixMs(NOW + 2))
        .await
        .expect("read")
        .expect("open");
    assert_eq!(read.applied_by(&identity), Some(first.as_str()));
    assert_eq!(read.applied_by(&retry), None);
    // the latest OPS_KEPT extends are kept: the oldest drop out, the rest still answer
    let ids: Vec<(String, String)> = (0..OPS_KEPT + 3).map(|_| (new_op(), new_op())).collect();
    for (i, (identity, by)) in ids.iter().enumerate() {
        let op = extend_op(identity, by);
        extend(s, "i", &op, 1.0, NOW + 10 + i as i64)
            .await
            .expect("open");
    }
    let last = s
        .store
        .read_reservation("ns", "i", UnixMs(NOW + 100))
        .await
        .expect("read")
        .expect("open");
    assert_eq!(last.total, 3.0 + (OPS_KEPT + 3) as f64);
    assert_eq!(last.applied_by(&identity), None, "dropped out");
    for (identity, by) in &ids[3..] {
        assert_eq!(last.applied_by(identity), Some(by.as_str()));
    }
    assert_eq!(last.extends.len(), OPS_KEPT);
}

/// Every change whose reply is lost (the store applied it) and which is sent again
/// under the same id answers what the first did, changing nothing more: an opening, an
/// extend, a commit.
pub async fn a_reservation_change_retried_after_a_lost_reply_applies_once(s: &TestStore) {
    let (store, faults) = crate::common::faulty(&s.store);
    let keys = keys();
    let o = OpenReservation {
        id: "lost",
        keys: &keys,
        total: 10.0,
        expires_at: UnixMs(NOW + 60_000),
        now: UnixMs(NOW),
        at: UnixMs(NOW),
        client: "c1",
        max_open: Some(1),
        max_open_per_client: Some(1),
    };
    faults.plan([Fault::FailAfter]);
    store
        .open_reservation("ns", o)
        .await
        .expect_err("the reply lost");
    assert_eq!(
        store
            .open_reservation("ns", o)
            .await
            .expect("again")
            .opening,
        Opening::Open,
        "its own record, not a cap it fills itself"
    );
    let op = new_op();
    let extend =
        || store.extend_reservation("ns", "lost", &op, 5.0, UnixMs(NOW), UnixMs(NOW), LATER);
    faults.plan([Fault::FailAfter]);
    extend().await.expect_err("the reply lost");
    let r = extend().await.expect("again").expect("open");
    assert_eq!(r.total, 15.0, "raised once");
    let commit = new_op();
    let take = || store.take_reservation("ns", "lost", &commit, 12.0, UnixMs(NOW + 1), LATER);
    faults.plan([Fault::FailAfter]);
    take().await.expect_err("the reply lost");
    let r = take().await.expect("again").expect("the record");
    let mine = Ended {
        op: commit.clone(),
        cost: 12.0,
    };
    assert_eq!(
        (r.total, r.ended),
        (15.0, Some(mine)),
        "ended by this commit"
    );
    assert_eq!(r.counted, vec![(UnixMs(NOW), 10.0), (UnixMs(NOW), 5.0)]);
    let n = s.store.open_reservations("ns", UnixMs(NOW + 2)).await;
    assert_eq!(n.expect("count"), 0, "an ended record is not open");
}

pub async fn a_reservation_change_past_its_deadline_changes_nothing(s: &TestStore) {
    assert!(open(s, "ns", "d", 2.0, 3_600_000).await);
    let past = UnixMs(swin_sync::clock::system_now().0 - 60_000);
    let e = s
        .store
        .extend_reservation("ns", "d", &new_op(), 1.0, UnixMs(NOW), UnixMs(NOW), past)
        .await
        .expect_err("too late");
    assert!(matches!(e, StoreError::TooLate), "{e:?}");
    let e = s
        .store
        .take_reservation("ns", "d", &new_op(), 1.0, UnixMs(NOW), past)
        .await
        .expect_err("too late");
    assert!(matches!(e, StoreError::TooLate), "{e:?}");
    let still = s
        .store
        .read_reservation("ns", "d", UnixMs(NOW))
        .await
        .expect("read")
        .expect("open");
    assert_eq!(still.total, 2.0);
}

pub async fn open_reservations_are_counted_per_namespace(s: &TestStore) {
    for (id, ttl) in [("a", 1_000), ("b", 30_000), ("c", 30_000)] {
        assert!(open(s, "ns", id, 1.0, ttl).await);
    }
    assert!(open(s, "elsewhere", "a", 1.0, 30_000).await);
    let n = |at: i64| s.store.open_reservations("ns", UnixMs(at));
    assert_eq!(n(NOW).await.expect("count"), 3);
    assert_eq!(n(NOW + 1_000).await.expect("count"), 2, "a lapsed");
    take(s, "b", &new_op(), 1.0, NOW).await.expect("record");
    assert_eq!(n(NOW + 1_000).await.expect("count"), 1);
}

/// A record says where each take of its total was counted, up to `MAX_COUNTED_TEXT`:
/// past it the total still rises, and the takes left unsaid are the difference.
pub async fn a_record_says_where_its_total_was_counted_up_to_its_most(s: &TestStore) {
    assert!(open(s, "ns", "c", 1_000_000.5, 3_600_000).await);
    let mut last = None;
    for i in 0..200 {
        let at = UnixMs(NOW + 1_000 * i);
        let after = s
            .store
            .extend_reservation(
                "ns",
                "c",
                &new_op(),
                0.125 + i as f64,
                at,
                UnixMs(NOW),
                LATER,
            )
            .await
            .expect("extend")
            .expect("open");
        last = Some(after);
    }
    let record = last.expect("extended");
    let all: f64 = (0..200).map(|i| 0.125 + i as f64).sum();
    assert_eq!(record.total, 1_000_000.5 + all);
    let kept = record.counted.len();
    assert!((20..200).contains(&kept), "{kept} takes kept");
    assert_eq!(record.counted[0], (UnixMs(NOW - 5), 1_000_000.5));
    for (i, &(at, v)) in record.counted[1..].iter().enumerate() {
        assert_eq!((at, v), (UnixMs(NOW + 1_000 * i as i64), 0.125 + i as f64));
    }
    let text: usize = record
        .counted
        .iter()
        .map(|(at, v)| format!("{}:{v};", at.0).len())
        .sum();
    assert!(text <= swin_sync::store::MAX_COUNTED_TEXT, "{text} bytes");
    let taken = take(s, "c", &"0".repeat(16), 7.0, NOW)
        .await
        .expect("record");
    let ended = ReservationRecord {
        ended: Some(Ended {
            op: "0".repeat(16),
            cost: 7.0,
        }),
        expires_at: taken.expires_at,
        ..record
    };
    assert_eq!(taken, ended, "a take answers the record as it stands");
}

/// An opening by `client` of `id` at `now`, the namespace capped at `max` open and each
/// client at `per_client`.
async fn open_capped(
    s: &TestStore,
    id: &str,
    client: &str,
    now: i64,
    (max, per_client): (u64, u64),
) -> Opening {
    let keys = keys();
    let o = OpenReservation {
        id,
        keys: &keys,
        total: 0.0,
        expires_at: UnixMs(now + 10_000),
        now: UnixMs(now),
        at: UnixMs(now),
        client,
        max_open: Some(max),
        max_open_per_client: Some(per_client),
    };
    s.store
        .open_reservation("caps", o)
        .await
        .expect("open")
        .opening
}

/// Open reservations are capped per namespace and per client, cost 0 or not: a refused
/// opening writes nothing; a commit, a lapse or another client's room frees what the
/// caps count, and an opening sent again finds its own record whatever the caps.
pub async fn open_reservations_are_capped_per_namespace_and_per_client(s: &TestStore) {
    let caps = (3, 2);
    assert_eq!(open_capped(s, "a1", "a", NOW, caps).await, Opening::Open);
    assert_eq!(open_capped(s, "a2", "a", NOW, caps).await, Opening::Open);
    assert_eq!(
        open_capped(s, "a3", "a", NOW, caps).await,
        Opening::ClientFull
    );
    assert_eq!(
        open_capped(s, "a1", "a", NOW, caps).await,
        Opening::Open,
        "its own record, sent again"
    );
    assert_eq!(open_capped(s, "b1", "b", NOW, caps).await, Opening::Open);
    assert_eq!(open_capped(s, "c1", "c", NOW, caps).await, Opening::Full);
    assert_eq!(open_capped(s, "n1", "", NOW, caps).await, Opening::Full);
    let read = |id: &'static str| s.store.read_reservation("caps", id, UnixMs(NOW));
    for id in ["a3", "c1", "n1"] {
        assert_eq!(read(id).await.expect("read"), None, "{id}: nothing written");
    }
    let n = s.store.open_reservations("caps", UnixMs(NOW)).await;
    assert_eq!(n.expect("count"), 3);
    // a commit frees a place, for the client and in the namespace
    s.store
        .take_reservation("caps", "a1", &new_op(), 0.0, UnixMs(NOW + 1), LATER)
        .await
        .expect("take")
        .expect("the record");
    assert_eq!(
        open_capped(s, "a3", "a", NOW + 2, caps).await,
        Opening::Open
    );
    assert_eq!(
        open_capped(s, "c1", "c", NOW + 2, caps).await,
        Opening::Full
    );
    // lapsed, they count no longer (client '' has no share of its own: the
    // namespace's cap only)
    let later = NOW + 20_000;
    for (id, client) in [("c2", "c"), ("n2", ""), ("n3", "")] {
        assert_eq!(
            open_capped(s, id, client, later, caps).await,
            Opening::Open,
            "{id}"
        );
    }
    assert_eq!(open_capped(s, "a4", "a", later, caps).await, Opening::Full);
    assert_eq!(
        open_capped(s, "c3", "c", later, (4, 2)).await,
        Opening::Open
    );
    assert_eq!(
        open_capped(s, "c4", "c", later, (5, 2)).await,
        Opening::ClientFull
    );
    // what an opening counted, before it, for the caps it checks; none it does not
    let keys = keys();
    let o = |id, max_open, max_open_per_client| OpenReservation {
        id,
        keys: &keys,
        total: 0.0,
        expires_at: UnixMs(later + 10_000),
        now: UnixMs(later),
        at: UnixMs(later),
        client: "d",
        max_open,
        max_open_per_client,
    };
    let opened = s.store.open_reservation("caps", o("d1", Some(10), Some(5)));
    let opened = opened.await.expect("open");
    assert_eq!(
        (opened.opening, opened.open, opened.client_open),
        (Opening::Open, Some(4), Some(0))
    );
    let opened = s.store.open_reservation("caps", o("d2", None, Some(1)));
    let opened = opened.await.expect("open");
    assert_eq!(
        (opened.opening, opened.client_open),
        (Opening::ClientFull, Some(1))
    );
    assert_eq!(opened.open, None, "the namespace's cap not checked");
    let opened = s.store.open_reservation("caps", o("d3", None, None));
    let opened = opened.await.expect("open");
    assert_eq!(opened.opening, Opening::Open, "no cap checked: opened");
}
