//! Reservations of a cost: a record is taken exactly once whatever races, an extend
//! raises it only while it is open, a lapsed record answers nothing, a change past its
//! deadline changes nothing, and the open ones of a namespace are counted.

use swin_core::UnixMs;
use swin_sync::store::{OpenReservation, ReservationRecord};
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
    };
    s.store.open_reservation(ns, o).await.expect("open")
}

pub async fn a_reservation_is_taken_exactly_once_under_racing_commits(s: &TestStore) {
    assert!(open(s, "ns", "r1", 4.0, 30_000).await);
    assert!(
        !open(s, "ns", "r1", 9.0, 30_000).await,
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
    };
    assert_eq!(read.as_ref(), Some(&want));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let store = s.store.clone();
            tokio::spawn(async move {
                store
                    .take_reservation("ns", "r1", UnixMs(NOW + 1), LATER)
                    .await
                    .expect("take")
            })
        })
        .collect();
    let mut taken = Vec::new();
    for t in tasks {
        taken.extend(t.await.expect("task"));
    }
    assert_eq!(taken, [want], "exactly one commit gets it");
    let none = s.store.read_reservation("ns", "r1", UnixMs(NOW)).await;
    assert_eq!(none.expect("read"), None);
    // another namespace never held it
    assert!(open(s, "other", "r2", 1.0, 30_000).await);
    let none = s
        .store
        .take_reservation("ns", "r2", UnixMs(NOW), LATER)
        .await;
    assert_eq!(none.expect("take"), None);
}

pub async fn an_extend_raises_an_open_reservation_only(s: &TestStore) {
    assert!(open(s, "ns", "x", 2.0, 1_000).await);
    let after = s
        .store
        .extend_reservation("ns", "x", 3.5, UnixMs(NOW + 10), UnixMs(NOW + 10), LATER)
        .await
        .expect("extend")
        .expect("open");
    assert_eq!(after.total, 5.5);
    let after = s
        .store
        .extend_reservation("ns", "x", 0.25, UnixMs(NOW + 20), UnixMs(NOW + 20), LATER)
        .await
        .expect("extend")
        .expect("open");
    assert_eq!((after.total, after.keys), (5.75, keys()));
    let counted = [(NOW - 5, 2.0), (NOW + 10, 3.5), (NOW + 20, 0.25)];
    let counted: Vec<_> = counted.iter().map(|&(t, v)| (UnixMs(t), v)).collect();
    assert_eq!(after.counted, counted, "where each take was counted");
    // past its lapse: nothing, and nothing changes
    let lapsed = s
        .store
        .extend_reservation(
            "ns",
            "x",
            1.0,
            UnixMs(NOW + 1_000),
            UnixMs(NOW + 1_000),
            LATER,
        )
        .await
        .expect("extend");
    assert_eq!(lapsed, None);
    let lapsed = s
        .store
        .take_reservation("ns", "x", UnixMs(NOW + 1_000), LATER)
        .await
        .expect("take");
    assert_eq!(lapsed, None);
    // taken: an extend finds nothing
    assert!(open(s, "ns", "y", 1.0, 30_000).await);
    s.store
        .take_reservation("ns", "y", UnixMs(NOW), LATER)
        .await
        .expect("take")
        .expect("open");
    let gone = s
        .store
        .extend_reservation("ns", "y", 1.0, UnixMs(NOW), UnixMs(NOW), LATER)
        .await
        .expect("extend");
    assert_eq!(gone, None);
}

pub async fn a_reservation_change_past_its_deadline_changes_nothing(s: &TestStore) {
    assert!(open(s, "ns", "d", 2.0, 3_600_000).await);
    let past = UnixMs(swin_sync::clock::system_now().0 - 60_000);
    let e = s
        .store
        .extend_reservation("ns", "d", 1.0, UnixMs(NOW), UnixMs(NOW), past)
        .await
        .expect_err("too late");
    assert!(matches!(e, StoreError::TooLate), "{e:?}");
    let e = s
        .store
        .take_reservation("ns", "d", UnixMs(NOW), past)
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
    s.store
        .take_reservation("ns", "b", UnixMs(NOW), LATER)
        .await
        .expect("take");
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
            .extend_reservation("ns", "c", 0.125 + i as f64, at, UnixMs(NOW), LATER)
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
    let taken = s
        .store
        .take_reservation("ns", "c", UnixMs(NOW), LATER)
        .await
        .expect("take");
    assert_eq!(
        taken,
        Some(record),
        "a take answers the record as it stands"
    );
}
