//! One hit: allowed up to the limit and denied past it (synchronous and periodic), a dry
//! run that spends nothing, a fresh limiter that reads the store at a key's first touch,
//! and a namespace in shadow that lets hits past its limit and says so.

use swin_testkit::TestStore;

use super::{hourly, known, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_synchronous_hit_is_allowed_to_the_limit_then_denied,
    a_periodic_hit_is_allowed_to_the_limit_then_denied,
    a_check_spends_nothing,
    a_fresh_limiter_reads_the_store_at_the_first_touch,
    a_namespace_in_shadow_allows_past_its_limit_and_says_so,
]);

/// Three hits of a limit of 3 pass, the fourth is denied with a wait, and the store holds
/// the three (a denied hit is taken back out).
async fn a_synchronous_hit_is_allowed_to_the_limit_then_denied(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 3)).await;
    for left in [2.0, 1.0, 0.0] {
        let v = limiter.hit("api", "k", 1.0).await.expect("hit");
        assert!(v.allowed(), "{v:?}");
        assert_eq!(v.decision().remaining, left);
        assert_eq!(v.decision().limit, 3.0);
        assert_eq!(v.decision().retry_after, std::time::Duration::ZERO);
        let policy = v
            .headers()
            .into_iter()
            .find(|(name, _)| *name == "RateLimit-Policy");
        assert!(
            policy.is_some_and(|(_, p)| p.starts_with("\"3600s\";")),
            "{v:?}"
        );
    }
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    assert!(!v.allowed(), "{v:?}");
    assert_eq!(v.decision().remaining, 0.0);
    assert!(
        v.decision().retry_after > std::time::Duration::ZERO,
        "{v:?}"
    );
    assert!(!v.shadow_denied());
    // synchronous: in the store as soon as the answer is
    assert_eq!(stored(store, "api", "k").await, 3.0);
    // another key has a limit of its own
    assert!(limiter
        .hit("api", "other", 1.0)
        .await
        .expect("hit")
        .allowed());
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    assert_eq!(stored(store, "api", "other").await, 1.0);
}

/// The same on a namespace that syncs every hour: decided on the node's counters, and
/// the three allowed hits are in the store after the stop's last push.
async fn a_periodic_hit_is_allowed_to_the_limit_then_denied(store: &TestStore) {
    let limiter = start(store, &hourly("api", 3600.0, 3)).await;
    for left in [2.0, 1.0, 0.0] {
        let v = limiter.hit("api", "k", 1.0).await.expect("hit");
        assert!(v.allowed(), "{v:?}");
        assert_eq!(v.decision().remaining, left);
    }
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    assert!(!v.allowed(), "{v:?}");
    assert!(
        v.decision().retry_after > std::time::Duration::ZERO,
        "{v:?}"
    );
    assert_eq!(known(&limiter, "api", "k").await, 3.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    // a fresh limiter over the store denies at once
    let fresh = start(store, &hourly("api", 3600.0, 3)).await;
    assert!(!fresh.hit("api", "k", 1.0).await.expect("hit").allowed());
    assert_eq!(known(&fresh, "api", "k").await, 3.0);
    fresh.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
}

/// A dry run answers what a hit would, allowed or denied, and counts nothing anywhere.
async fn a_check_spends_nothing(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 3)).await;
    // never touched: allowed, nothing counted
    let v = limiter.check("api", "k", 1.0).await.expect("check");
    assert!(v.allowed(), "{v:?}");
    assert_eq!(v.decision().remaining, 2.0);
    assert_eq!(stored(store, "api", "k").await, 0.0);
    for _ in 0..2 {
        assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    for _ in 0..5 {
        let v = limiter.check("api", "k", 1.0).await.expect("check");
        assert!(v.allowed(), "{v:?}");
        assert_eq!(v.decision().remaining, 0.0);
    }
    // a check of a cost past what is left is denied, and spends nothing either
    let v = limiter.check("api", "k", 2.0).await.expect("check");
    assert!(!v.allowed(), "{v:?}");
    assert!(v.decision().retry_after > std::time::Duration::ZERO);
    assert_eq!(stored(store, "api", "k").await, 2.0);
    assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    let v = limiter.check("api", "k", 1.0).await.expect("check");
    assert!(!v.allowed(), "{v:?}");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
}

/// B runs before A counts anything and syncs only every hour: its first hit on the key
/// A spent reads the store, and is denied.
async fn a_fresh_limiter_reads_the_store_at_the_first_touch(store: &TestStore) {
    let b = start(store, &hourly("api", 3600.0, 3)).await;
    // B's load of the namespace's totals done: one that lands after A's first hit holds
    // the key at that count, and the first touch does not read it (a known gap)
    let warming =
        || serde_json::to_value(b.readiness(false)).expect("a document")["warming"].clone();
    for _ in 0..200 {
        if warming().is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(warming().is_null(), "B still loading: {}", warming());
    let a = start(store, &hourly("api", 0.0, 3)).await;
    for _ in 0..3 {
        assert!(a.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    assert_eq!(stored(store, "api", "k").await, 3.0);
    let v = b.hit("api", "k", 1.0).await.expect("hit");
    assert!(
        !v.allowed(),
        "B did not see A's 3 hits at its first touch: {v:?}"
    );
    assert!(v.decision().retry_after > std::time::Duration::ZERO);
    assert_eq!(known(&b, "api", "k").await, 3.0);
    // a check reads the store at its first touch too
    let v = b.check("api", "k2", 1.0).await.expect("check");
    assert!(v.allowed());
    for _ in 0..3 {
        assert!(a.hit("api", "k2", 1.0).await.expect("hit").allowed());
    }
    a.stop().await.expect("stop");
    b.stop().await.expect("stop");
    // B's denied hit counted nothing
    assert_eq!(stored(store, "api", "k").await, 3.0);
    assert_eq!(stored(store, "api", "k2").await, 3.0);
}

/// `shadow = true`: the namespace decides and counts but never denies; a hit past the
/// limit passes, marked as one the limit would have denied.
async fn a_namespace_in_shadow_allows_past_its_limit_and_says_so(store: &TestStore) {
    let namespace = format!("{}shadow = true\n", hourly("trial", 0.0, 2));
    let limiter = start(store, &namespace).await;
    for _ in 0..2 {
        let v = limiter.hit("trial", "k", 1.0).await.expect("hit");
        assert!(v.allowed() && !v.shadow_denied(), "{v:?}");
    }
    for _ in 0..2 {
        let v = limiter.hit("trial", "k", 1.0).await.expect("hit");
        assert!(v.allowed(), "a namespace in shadow denied: {v:?}");
        assert!(v.shadow_denied(), "{v:?}");
        assert_eq!(v.decision().remaining, 0.0);
        assert!(
            v.decision().retry_after > std::time::Duration::ZERO,
            "{v:?}"
        );
    }
    // a check says the same
    let v = limiter.check("trial", "k", 1.0).await.expect("check");
    assert!(v.allowed() && v.shadow_denied(), "{v:?}");
    assert_eq!(stored(store, "trial", "k").await, 4.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "trial", "k").await, 4.0);
}
