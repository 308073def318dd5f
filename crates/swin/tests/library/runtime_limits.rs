//! Limits set per key at run time, kept in the store: the next hit is decided under
//! them (on this limiter and on a fresh one at its first touch), they are read and
//! listed, and once removed the config's limits decide again.

use serde_json::json;
use swin::error::Error;
use swin::requests::Change;
use swin_testkit::TestStore;

use super::{document, hourly, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_runtime_limit_decides_the_next_hit,
    removing_a_runtime_limit_restores_the_config,
    a_key_no_request_could_name_has_no_runtime_limits,
]);

/// `limit` hits an hour, as a client writes it.
fn change(limit: u32) -> Change {
    let change: Change = toml::from_str(&format!(
        "limits = [{{ window_size = 3600, limit = {limit} }}]"
    ))
    .expect("limits");
    change.by("ops")
}

async fn a_runtime_limit_decides_the_next_hit(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 5)).await;
    for _ in 0..2 {
        assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    let set = limiter
        .set_limits("api", "k", change(2))
        .await
        .expect("set");
    let set = document(&set);
    assert_eq!(
        (&set["key"], &set["source"]),
        (&json!("k"), &json!("override"))
    );
    assert_eq!(set["set_by"], "ops");
    assert_eq!(set["expires_at"], json!(null));
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    assert!(!v.allowed(), "the runtime limit of 2 did not decide: {v:?}");
    assert_eq!(v.decision().limit, 2.0);
    // other keys keep the config's
    let v = limiter.hit("api", "other", 1.0).await.expect("hit");
    assert!(v.allowed());
    assert_eq!(v.decision().limit, 5.0);
    // a fresh limiter decides under it at its first touch
    let fresh = start(store, &hourly("api", 3600.0, 5)).await;
    let v = fresh.hit("api", "k", 1.0).await.expect("hit");
    assert!(
        !v.allowed(),
        "a fresh limiter did not see the runtime limit: {v:?}"
    );
    assert_eq!(v.decision().limit, 2.0);
    // read and listed, on either
    let read = fresh.limits("api", "k").await.expect("read");
    assert_eq!(document(&read)["set_by"], "ops");
    let other = document(&limiter.limits("api", "other").await.expect("read"));
    assert_eq!(
        (&other["source"], other.get("set_by")),
        (&json!("config"), None)
    );
    let listed = document(&limiter.list_limits("api", None, 10).await.expect("list"));
    assert_eq!(listed, json!([listed[0]]));
    assert_eq!(listed[0]["key"], "k");
    let json = listed[0]["limits"].to_string();
    assert!(json.contains("3600"), "{json}");
    assert!(limiter
        .list_limits("api", Some("k"), 10)
        .await
        .expect("list")
        .is_empty());
    // a raise lets the key past the old limit
    limiter
        .set_limits("api", "k", change(3))
        .await
        .expect("set");
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    assert!(v.allowed(), "{v:?}");
    assert_eq!(v.decision().limit, 3.0);
    // a limit of a shape the namespace does not take is refused
    let gcra: Change =
        toml::from_str("gcra = { burst = 5, count = 5, period = \"1m\" }").expect("limits");
    let e = limiter
        .set_limits("api", "k", gcra.by("ops"))
        .await
        .expect_err("a bucket on a window namespace");
    assert!(matches!(e, Error::BadRequest(_)), "{e:?}");
    limiter.stop().await.expect("stop");
    fresh.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    assert_eq!(stored(store, "api", "other").await, 1.0);
}

async fn removing_a_runtime_limit_restores_the_config(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 5)).await;
    limiter
        .set_limits("api", "k", change(1))
        .await
        .expect("set");
    assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    assert!(!limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    assert!(limiter.remove_limits("api", "k").await.expect("remove"));
    assert!(!limiter.remove_limits("api", "k").await.expect("remove"));
    assert_eq!(
        document(&limiter.limits("api", "k").await.expect("read"))["source"],
        "config"
    );
    assert!(limiter
        .list_limits("api", None, 10)
        .await
        .expect("list")
        .is_empty());
    for left in [3.0, 2.0, 1.0, 0.0] {
        let v = limiter.hit("api", "k", 1.0).await.expect("hit");
        assert!(v.allowed(), "{v:?}");
        assert_eq!(v.decision().limit, 5.0);
        assert_eq!(v.decision().remaining, left);
    }
    assert!(!limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    // a fresh limiter decides under the config's too
    let fresh = start(store, &hourly("api", 3600.0, 5)).await;
    let v = fresh.check("api", "k", 1.0).await.expect("check");
    assert!(!v.allowed());
    assert_eq!(v.decision().limit, 5.0);
    limiter.stop().await.expect("stop");
    fresh.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 5.0);
}

/// A key that no hit could name (empty, or past `MAX_KEY_BYTES`) is refused by every
/// runtime-limit call, as by a hit: nothing is stored under it, and the key a hit can
/// name keeps the config's limits.
async fn a_key_no_request_could_name_has_no_runtime_limits(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 5)).await;
    let long = "k".repeat(1025); // past the longest key (docs/api.md)
    for key in ["", long.as_str()] {
        let e = limiter
            .set_limits("api", key, change(1))
            .await
            .expect_err("set on a bad key");
        assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
        let e = limiter.limits("api", key).await.expect_err("read");
        assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
        let e = limiter.remove_limits("api", key).await.expect_err("remove");
        assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
        let e = limiter.hit("api", key, 1.0).await.expect_err("hit");
        assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
    }
    assert!(limiter
        .list_limits("api", None, 10)
        .await
        .expect("list")
        .is_empty());
    limiter.stop().await.expect("stop");
}
