//! Concurrency leases, kept in the store: acquires up to the limit and not past it, a
//! release that frees a slot at once (for every limiter over the store), a renewal that
//! moves the lapse, a lapse that frees the slot, and a lease that is not live.

use std::time::Duration;

use swin::error::Error;
use swin::requests::AcquireRequest;
use swin_testkit::TestStore;

use super::{settled as answered, start};

swin_testkit::for_stores!([sqlite, redis] [
    leases_fill_to_the_limit_and_a_release_frees_a_slot,
    a_renewal_moves_the_lapse_and_a_lapse_frees_the_slot,
    a_lease_that_is_not_live_is_unknown,
]);

/// Two slots in flight per key, leases kept in the store.
const SLOTS: &str = "[[namespaces]]\nname = \"slots\"\nstore = \"main\"\n\
    algorithm = \"concurrency\"\nlimit = 2\nlease_ttl = 30\nsync_rate = 0.1\n";

fn one() -> AcquireRequest {
    AcquireRequest::new(1, None, None)
}

/// Two limiters over one store share the key's two slots.
async fn leases_fill_to_the_limit_and_a_release_frees_a_slot(store: &TestStore) {
    let a = start(store, SLOTS).await;
    let b = start(store, SLOTS).await;
    let first = a.acquire("slots", "k", one()).await.expect("acquire");
    assert!(first.allowed(), "{first:?}");
    assert_eq!(answered(&first, "in_flight"), 1.0);
    assert_eq!(answered(&first, "limit"), 2.0);
    assert!(first.expires_at() > std::time::SystemTime::now());
    let second = b.acquire("slots", "k", one()).await.expect("acquire");
    assert!(second.allowed(), "{second:?}");
    assert_eq!(answered(&second, "in_flight"), 2.0);
    assert_ne!(first.lease(), second.lease());
    for limiter in [&a, &b] {
        let third = limiter.acquire("slots", "k", one()).await.expect("acquire");
        assert!(!third.allowed(), "a third slot of 2: {third:?}");
        assert_eq!(answered(&third, "in_flight"), 2.0);
        assert!(answered(&third, "retry_after") > 0.0);
    }
    // two slots at once, on another key: its own limit
    let two = a
        .acquire("slots", "j", AcquireRequest::new(2, None, None))
        .await
        .expect("acquire");
    assert!(two.allowed(), "{two:?}");
    // released on one limiter, free on the other at once
    a.release("slots", "k", second.lease())
        .await
        .expect("release");
    let again = b.acquire("slots", "k", one()).await.expect("acquire");
    assert!(again.allowed(), "the released slot is free: {again:?}");
    assert_eq!(answered(&again, "in_flight"), 2.0);
    assert!(!a
        .acquire("slots", "k", one())
        .await
        .expect("acquire")
        .allowed());
    // a client's own id: a retried acquire replaces itself
    b.release("slots", "k", again.lease())
        .await
        .expect("release");
    let mine = AcquireRequest::new(1, None, Some("request-7".into()));
    let once = a
        .acquire("slots", "k", mine.clone())
        .await
        .expect("acquire");
    let retried = b.acquire("slots", "k", mine).await.expect("acquire");
    assert!(once.allowed() && retried.allowed());
    assert_eq!(retried.lease(), "request-7");
    assert_eq!(
        answered(&retried, "in_flight"),
        2.0,
        "a retry took a second slot"
    );
    a.stop().await.expect("stop");
    b.stop().await.expect("stop");
}

/// A lease of a second's ttl renewed for a minute outlives its second; one not renewed
/// lapses and frees its slot.
async fn a_renewal_moves_the_lapse_and_a_lapse_frees_the_slot(store: &TestStore) {
    let limiter = start(store, SLOTS).await;
    let short = AcquireRequest::new(1, Some(1.0), None);
    let kept = limiter
        .acquire("slots", "k", short.clone())
        .await
        .expect("acquire");
    let lapsing = limiter.acquire("slots", "k", short).await.expect("acquire");
    assert!(kept.allowed() && lapsing.allowed());
    let until = limiter
        .renew("slots", "k", kept.lease(), Some(60.0))
        .await
        .expect("renew");
    assert!(
        until >= kept.expires_at() + Duration::from_secs(58),
        "renewed to {until:?}, was {:?}",
        kept.expires_at()
    );
    // renewed with the namespace's lease_ttl
    let until = limiter
        .renew("slots", "k", kept.lease(), None)
        .await
        .expect("renew");
    // kept was acquired for a second: its lapse, less that second, is when
    assert!(
        until + Duration::from_secs(1) >= kept.expires_at() + Duration::from_secs(29),
        "{until:?}"
    );
    assert!(!limiter
        .acquire("slots", "k", one())
        .await
        .expect("acquire")
        .allowed());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // the lapsed lease is gone, the renewed one lives
    let e = limiter
        .renew("slots", "k", lapsing.lease(), None)
        .await
        .expect_err("lapsed");
    assert!(matches!(e, Error::UnknownLease(_)), "{e:?}");
    let next = limiter.acquire("slots", "k", one()).await.expect("acquire");
    assert!(next.allowed(), "the lapsed slot is free: {next:?}");
    assert_eq!(
        answered(&next, "in_flight"),
        2.0,
        "the renewed lease lapsed"
    );
    limiter
        .release("slots", "k", kept.lease())
        .await
        .expect("the renewed lease is live");
    limiter.stop().await.expect("stop");
}

async fn a_lease_that_is_not_live_is_unknown(store: &TestStore) {
    let limiter = start(store, SLOTS).await;
    let e = limiter
        .release("slots", "k", "never-granted")
        .await
        .expect_err("unknown");
    assert!(matches!(e, Error::UnknownLease(_)), "{e:?}");
    let e = limiter
        .renew("slots", "k", "never-granted", None)
        .await
        .expect_err("unknown");
    assert!(matches!(e, Error::UnknownLease(_)), "{e:?}");
    let lease = limiter.acquire("slots", "k", one()).await.expect("acquire");
    // a lease is its key's: another key does not know it
    let e = limiter
        .release("slots", "other", lease.lease())
        .await
        .expect_err("another key's");
    assert!(matches!(e, Error::UnknownLease(_)), "{e:?}");
    let replayed = limiter
        .release("slots", "k", lease.lease())
        .await
        .expect("release");
    assert!(!replayed, "this release ended it");
    // released twice (a release sent again after its answer was lost): told it was
    // released, nothing changed
    let replayed = limiter
        .release("slots", "k", lease.lease())
        .await
        .expect("released twice");
    assert!(replayed, "another release ended it");
    let e = limiter
        .renew("slots", "k", lease.lease(), None)
        .await
        .expect_err("renewed after its release");
    assert!(matches!(e, Error::UnknownLease(_)), "{e:?}");
    limiter.stop().await.expect("stop");
}
