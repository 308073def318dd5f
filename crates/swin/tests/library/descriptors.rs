//! Envoy's descriptors, decided by the library as Envoy's rate limit service call would
//! be: under the namespace's descriptor rules, each descriptor counted on its own counter
//! key, and a request over the limit counts nothing of any of its descriptors.

use swin::requests::{Decided, Descriptor};
use swin_testkit::TestStore;

use super::{start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    descriptors_over_the_limit_deny_the_request_and_count_nothing,
    negative_hits_give_back_and_never_below_zero,
]);

/// Logins: 2 a minute per address; searches: 10 a minute in all.
const EDGE: &str = r#"
[[namespaces]]
name = "edge"
store = "main"
sync_rate = 0

[[namespaces.descriptors]]
key = "generic_key"
value = "login"
[[namespaces.descriptors.descriptors]]
key = "remote_address"
rate_limit = { unit = "minute", requests_per_unit = 2 }

[[namespaces.descriptors]]
key = "generic_key"
value = "search"
rate_limit = { unit = "minute", requests_per_unit = 10 }
"#;

const LOGIN: &str = "generic_key=login|remote_address=10.0.0.1";
const SEARCH: &str = "generic_key=search";

/// A login from `address` and a search, one hit each.
fn request(address: &str) -> Vec<Descriptor<'_>> {
    vec![
        Descriptor::new(
            vec![("generic_key", "login"), ("remote_address", address)],
            1,
            false,
            None,
        ),
        Descriptor::new(vec![("generic_key", "search")], 1, false, None),
        // no rule: OK, no limit, nothing counted
        Descriptor::new(vec![("generic_key", "browse")], 1, false, None),
    ]
}

/// Whether the descriptor `i` of `d` denied the request.
fn denied(d: &Decided, i: usize) -> bool {
    d.answers()[i].over()
}

async fn descriptors_over_the_limit_deny_the_request_and_count_nothing(store: &TestStore) {
    let limiter = start(store, EDGE).await;
    for _ in 0..2 {
        let d = limiter
            .descriptors("edge", &request("10.0.0.1"))
            .await
            .expect("decided");
        assert!(!d.over(), "{d:?}");
        assert_eq!(d.answers().len(), 3);
        assert_eq!(d.answers()[2].limit(), None, "no rule: no limit");
    }
    assert_eq!(stored(store, "edge", LOGIN).await, 2.0);
    assert_eq!(stored(store, "edge", SEARCH).await, 2.0);
    for _ in 0..3 {
        let d = limiter
            .descriptors("edge", &request("10.0.0.1"))
            .await
            .expect("decided");
        assert!(d.over(), "a third login of 2 a minute: {d:?}");
        assert!(denied(&d, 0), "{d:?}");
        assert!(!denied(&d, 1), "{d:?}");
    }
    // the search of the refused requests did not count
    assert_eq!(stored(store, "edge", LOGIN).await, 2.0);
    assert_eq!(
        stored(store, "edge", SEARCH).await,
        2.0,
        "a request over the limit counted its other descriptor"
    );
    // another address has logins of its own, and the searches left are all there
    for _ in 0..2 {
        let d = limiter
            .descriptors("edge", &request("10.0.0.2"))
            .await
            .expect("decided");
        assert!(!d.over(), "{d:?}");
    }
    assert_eq!(stored(store, "edge", SEARCH).await, 4.0);
    assert!(!store
        .totals("edge")
        .await
        .keys()
        .any(|k| k.contains("browse")));
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "edge", LOGIN).await, 2.0);
    assert_eq!(
        stored(store, "edge", "generic_key=login|remote_address=10.0.0.2").await,
        2.0
    );
    assert_eq!(stored(store, "edge", SEARCH).await, 4.0);
}

/// Envoy's `is_negative_hits`: the hits go back, as a refund's do, never below zero, and
/// the request is OK.
async fn negative_hits_give_back_and_never_below_zero(store: &TestStore) {
    let limiter = start(store, EDGE).await;
    let login = |hits: u64, negative: bool| {
        vec![Descriptor::new(
            vec![("generic_key", "login"), ("remote_address", "10.0.0.1")],
            hits,
            negative,
            None,
        )]
    };
    let d = limiter
        .descriptors("edge", &login(2, false))
        .await
        .expect("decided");
    assert!(!d.over(), "{d:?}");
    assert!(limiter
        .descriptors("edge", &login(1, false))
        .await
        .expect("decided")
        .over());
    assert_eq!(stored(store, "edge", LOGIN).await, 2.0);
    let d = limiter
        .descriptors("edge", &login(1, true))
        .await
        .expect("decided");
    assert!(!d.over(), "{d:?}");
    assert_eq!(stored(store, "edge", LOGIN).await, 1.0);
    let d = limiter
        .descriptors("edge", &login(5, true))
        .await
        .expect("decided");
    assert!(!d.over(), "{d:?}");
    assert_eq!(stored(store, "edge", LOGIN).await, 0.0);
    // the whole limit again, and no more
    assert!(!limiter
        .descriptors("edge", &login(2, false))
        .await
        .expect("decided")
        .over());
    assert!(limiter
        .descriptors("edge", &login(1, false))
        .await
        .expect("decided")
        .over());
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "edge", LOGIN).await, 2.0);
}
