//! Reserve, then commit: an estimate spent as a hit, settled at the actual cost. Below
//! the estimate gives back; above charges all of it as debt (by default), or what the
//! limit leaves under `overrun = "cap"` (the rest reported uncharged); a reservation
//! settles once, on any limiter over the store. Reservations over several keys and
//! extends are in `reservations_multi`.

use swin::error::Error;
use swin_testkit::TestStore;

use super::{hourly, replayed, settled, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_commit_below_the_estimate_gives_back,
    a_commit_above_the_estimate_charges_what_the_limit_leaves,
    a_reservation_settles_once,
    another_limiter_over_the_store_settles_a_reservation,
]);

/// `namespace` (one `[[namespaces]]` entry) with `overrun = "cap"`.
pub fn capped(namespace: &str) -> String {
    format!("{namespace}overrun = \"cap\"\n")
}

/// The reservation's id, of an allowed reserve.
pub fn id(r: &swin::requests::Reserved) -> String {
    let (id, _) = r.reservation().expect("allowed: a reservation");
    id.to_owned()
}

async fn a_commit_below_the_estimate_gives_back(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 10)).await;
    let r = limiter
        .reserve("api", &["k"], 4.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed(), "{r:?}");
    assert_eq!(r.verdict().decision().remaining, 6.0);
    assert_eq!(stored(store, "api", "k").await, 4.0);
    let s = limiter
        .commit("api", "k", &id(&r), 1.0)
        .await
        .expect("commit");
    assert_eq!(settled(&s, "estimate"), 4.0);
    assert_eq!(settled(&s, "cost"), 1.0);
    assert_eq!(settled(&s, "given_back"), 3.0);
    assert_eq!(settled(&s, "charged"), 0.0);
    assert_eq!(settled(&s, "uncharged"), 0.0);
    assert_eq!(s.after().decision().remaining, 9.0);
    assert_eq!(stored(store, "api", "k").await, 1.0);
    // settled at zero: all of it back
    let r = limiter
        .reserve("api", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    let s = limiter
        .commit("api", "k", &id(&r), 0.0)
        .await
        .expect("commit");
    assert_eq!(settled(&s, "given_back"), 2.0);
    assert_eq!(stored(store, "api", "k").await, 1.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 1.0);
}

/// Under `overrun = "cap"`: 5 of 10 spent, a reservation of 2 committed at 3 (room for
/// it: charged in full), then one of 1 committed at 4: the limit leaves 1 of the 3 over
/// the estimate, 2 are uncharged, and the key is at its limit, not past it.
async fn a_commit_above_the_estimate_charges_what_the_limit_leaves(store: &TestStore) {
    let limiter = start(store, &capped(&hourly("api", 0.0, 10))).await;
    assert!(limiter.hit("api", "k", 5.0).await.expect("hit").allowed());
    let r = limiter
        .reserve("api", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed());
    let s = limiter
        .commit("api", "k", &id(&r), 3.0)
        .await
        .expect("commit");
    assert_eq!(
        (
            settled(&s, "charged"),
            settled(&s, "uncharged"),
            settled(&s, "given_back")
        ),
        (1.0, 0.0, 0.0)
    );
    assert_eq!(stored(store, "api", "k").await, 8.0);
    let r = limiter
        .reserve("api", &["k"], 1.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed());
    assert_eq!(stored(store, "api", "k").await, 9.0);
    let s = limiter
        .commit("api", "k", &id(&r), 4.0)
        .await
        .expect("commit");
    assert_eq!(settled(&s, "charged"), 1.0, "{s:?}");
    assert_eq!(settled(&s, "uncharged"), 2.0, "{s:?}");
    assert_eq!(settled(&s, "given_back"), 0.0, "{s:?}");
    assert_eq!(s.after().decision().remaining, 0.0);
    assert_eq!(
        stored(store, "api", "k").await,
        10.0,
        "a commit went past the limit"
    );
    // a reserve past the limit is denied as a hit is, with no reservation
    let r = limiter
        .reserve("api", &["k"], 1.0, None, None)
        .await
        .expect("reserve");
    assert!(!r.verdict().allowed());
    assert!(r.reservation().is_none());
    assert_eq!(stored(store, "api", "k").await, 10.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 10.0);
}

async fn a_reservation_settles_once(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 10)).await;
    let r = limiter
        .reserve("api", &["k"], 3.0, None, None)
        .await
        .expect("reserve");
    let id = id(&r);
    limiter.commit("api", "k", &id, 1.0).await.expect("commit");
    assert_eq!(stored(store, "api", "k").await, 1.0);
    // the same commit again (its answer lost) is told how the first settled it
    let again = limiter.commit("api", "k", &id, 1.0).await.expect("again");
    assert!(replayed(&again), "{again:?}");
    assert_eq!(
        (settled(&again, "estimate"), settled(&again, "given_back")),
        (3.0, 2.0)
    );
    for cost in [0.0, 5.0] {
        let e = limiter
            .commit("api", "k", &id, cost)
            .await
            .expect_err("a second commit at another cost");
        assert!(matches!(e, Error::AlreadyCommitted(_)), "{e:?}");
    }
    assert_eq!(stored(store, "api", "k").await, 1.0, "settled once");
    for never in [
        "0123456789abcdef0123456789abcdef",
        // the form of ids made before reservations were recorded with their total
        "0123456789abcdef0123456789abcdef.3",
    ] {
        let e = limiter
            .commit("api", "k", never, 1.0)
            .await
            .expect_err("never made");
        assert!(matches!(e, Error::UnknownReservation(_)), "{e:?}");
    }
    // another key does not know it
    let r = limiter
        .reserve("api", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    let e = limiter
        .commit("api", "other", &super::reservations::id(&r), 1.0)
        .await
        .expect_err("another key's");
    assert!(matches!(e, Error::UnknownReservation(_)), "{e:?}");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    assert_eq!(stored(store, "api", "other").await, 0.0);
    limiter.stop().await.expect("stop");
}

async fn another_limiter_over_the_store_settles_a_reservation(store: &TestStore) {
    let a = start(store, &hourly("api", 0.0, 10)).await;
    let b = start(store, &hourly("api", 0.0, 10)).await;
    let r = a
        .reserve("api", &["k"], 5.0, None, None)
        .await
        .expect("reserve");
    let id = id(&r);
    let s = b.commit("api", "k", &id, 2.0).await.expect("commit on b");
    assert_eq!(settled(&s, "given_back"), 3.0);
    assert_eq!(stored(store, "api", "k").await, 2.0);
    let again = a.commit("api", "k", &id, 2.0).await.expect("settled on b");
    assert!(replayed(&again), "{again:?}");
    assert_eq!(stored(store, "api", "k").await, 2.0, "settled once");
    // a's next decision sees what b gave back
    let v = a.hit("api", "k", 1.0).await.expect("hit");
    assert_eq!(v.decision().remaining, 7.0, "{v:?}");
    a.stop().await.expect("stop");
    b.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
}
