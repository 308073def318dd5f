//! Batches of hits across keys and namespaces: all or nothing. A batch with one hit
//! denied counts none of its hits; one with a bad item is refused before anything is
//! counted, its error naming the item.

use swin::error::Error;
use swin_testkit::TestStore;

use super::{hourly, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_batch_within_its_limits_counts_every_hit,
    a_batch_with_one_key_at_its_limit_counts_nothing,
    a_batch_with_a_bad_item_counts_nothing_and_names_it,
]);

/// Two synchronous namespaces: `a` of 5 an hour, `b` of 1.
fn two() -> String {
    format!("{}\n{}", hourly("a", 0.0, 5), hourly("b", 0.0, 1))
}

async fn a_batch_within_its_limits_counts_every_hit(store: &TestStore) {
    let limiter = start(store, &two()).await;
    let batch = limiter
        .hits(
            &[("a", "k", 2.0), ("b", "k", 1.0), ("a", "j", 1.0)],
            false,
            10,
        )
        .await
        .expect("batch");
    assert!(!batch.denied());
    assert_eq!(batch.verdicts().len(), 3);
    assert!(batch.verdicts().iter().all(|v| v.allowed()));
    assert_eq!(batch.verdicts()[0].decision().remaining, 3.0);
    assert_eq!(batch.verdicts()[1].decision().remaining, 0.0);
    // the strictest is the one with the least left
    assert_eq!(batch.strictest().decision().limit, 1.0);
    assert_eq!(stored(store, "a", "k").await, 2.0);
    assert_eq!(stored(store, "a", "j").await, 1.0);
    assert_eq!(stored(store, "b", "k").await, 1.0);
    // a dry run of a batch counts nothing
    let dry = limiter
        .hits(&[("a", "k", 1.0), ("a", "j", 1.0)], true, 10)
        .await
        .expect("batch");
    assert!(!dry.denied());
    assert_eq!(stored(store, "a", "k").await, 2.0);
    assert_eq!(stored(store, "a", "j").await, 1.0);
    limiter.stop().await.expect("stop");
}

/// `b`'s key is at its limit: the batch is denied and `a`'s key, which had room, is not
/// counted either — in the store, and in what the limiter answers next.
async fn a_batch_with_one_key_at_its_limit_counts_nothing(store: &TestStore) {
    let limiter = start(store, &two()).await;
    assert!(limiter.hit("b", "k", 1.0).await.expect("hit").allowed());
    for _ in 0..3 {
        let batch = limiter
            .hits(&[("a", "k", 1.0), ("b", "k", 1.0)], false, 10)
            .await
            .expect("batch");
        assert!(batch.denied(), "{batch:?}");
        assert!(!batch.verdicts()[1].allowed());
        assert!(batch.verdicts()[1].decision().retry_after > std::time::Duration::ZERO);
        assert!(!batch.strictest().allowed());
    }
    assert_eq!(stored(store, "a", "k").await, 0.0, "a denied batch counted");
    assert_eq!(stored(store, "b", "k").await, 1.0);
    // all of a's limit is still there
    for left in [4.0, 3.0, 2.0, 1.0, 0.0] {
        let v = limiter.hit("a", "k", 1.0).await.expect("hit");
        assert!(v.allowed(), "{v:?}");
        assert_eq!(v.decision().remaining, left);
    }
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "a", "k").await, 5.0);
    assert_eq!(stored(store, "b", "k").await, 1.0);
}

/// A bad key, a bad cost, an unknown namespace, too many items: an error (the bad
/// item named `hits[i]`), and nothing of the batch counted.
async fn a_batch_with_a_bad_item_counts_nothing_and_names_it(store: &TestStore) {
    let limiter = start(store, &two()).await;
    let e = limiter
        .hits(
            &[("a", "k", 1.0), ("b", "k", 1.0), ("a", "", 1.0)],
            false,
            10,
        )
        .await
        .expect_err("an empty key");
    assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
    assert!(e.to_string().starts_with("hits[2]: "), "{e}");
    let e = limiter
        .hits(&[("a", "k", 1.0), ("b", "k", -1.0)], false, 10)
        .await
        .expect_err("a negative cost");
    assert!(e.to_string().starts_with("hits[1]: "), "{e}");
    let e = limiter
        .hits(&[("a", "k", 1.0), ("nowhere", "k", 1.0)], false, 10)
        .await
        .expect_err("an unknown namespace");
    assert!(matches!(e, Error::UnknownNamespace(_)), "{e:?}");
    let e = limiter
        .hits(&[("a", "k", 1.0), ("a", "j", 1.0)], false, 1)
        .await
        .expect_err("more than max");
    assert!(matches!(e, Error::BadRequest(_)), "{e:?}");
    assert_eq!(stored(store, "a", "k").await, 0.0);
    assert_eq!(stored(store, "a", "j").await, 0.0);
    assert_eq!(stored(store, "b", "k").await, 0.0);
    limiter.stop().await.expect("stop");
    assert!(store.totals("a").await.is_empty());
    assert!(store.totals("b").await.is_empty());
}
