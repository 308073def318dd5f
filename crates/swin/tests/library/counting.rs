//! Counting without a limit: increments in one window size or in all, batches of them
//! (all or nothing), reads of a key's rates; and refunds, which give back admitted hits
//! and never go below zero.

use swin::error::Error;
use swin::WindowRate;
use swin_testkit::TestStore;

use super::{hourly, settled as answered, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    increments_count_in_each_window_size_and_read_back,
    an_increments_batch_with_a_bad_item_counts_nothing,
    a_refund_gives_back_and_never_below_zero,
]);

/// A synchronous namespace that counts in windows of a minute and of an hour.
const COUNTS: &str = "[[namespaces]]\nname = \"count\"\nstore = \"main\"\n\
    window_sizes = [60, 3600]\nsync_rate = 0\n";

/// A key's windows as (size, current + previous), by size.
fn counts(rates: &[WindowRate]) -> Vec<(u32, f64)> {
    let mut out: Vec<(u32, f64)> = rates
        .iter()
        .map(|r| (r.window_size, r.current + r.previous))
        .collect();
    out.sort_by_key(|c| c.0);
    out
}

async fn increments_count_in_each_window_size_and_read_back(store: &TestStore) {
    let limiter = start(store, COUNTS).await;
    let after = limiter
        .increment("count", "k", Some(2.0), None)
        .await
        .expect("increment");
    assert_eq!(counts(&after), [(60, 2.0), (3600, 2.0)]);
    let after = limiter
        .increment("count", "k", None, Some(3600))
        .await
        .expect("increment");
    assert_eq!(counts(&after), [(3600, 3.0)]);
    let e = limiter
        .increment("count", "k", None, Some(7))
        .await
        .expect_err("no such window size");
    assert!(matches!(e, Error::UnknownWindowSize(_)), "{e:?}");
    let batch = limiter
        .increments(
            &[
                ("count", "k", Some(1.5), Some(60)),
                ("count", "j", None, None),
            ],
            10,
        )
        .await
        .expect("batch");
    assert_eq!(counts(&batch[0]), [(60, 3.5)]);
    assert_eq!(counts(&batch[1]), [(60, 1.0), (3600, 1.0)]);
    let read = limiter.rates("count", "k", None).await.expect("rates");
    assert_eq!(counts(&read), [(60, 3.5), (3600, 3.0)]);
    assert_eq!(store.totals_in("count", Some(60)).await["k"], 3.5);
    assert_eq!(store.totals_in("count", Some(3600)).await["k"], 3.0);
    assert_eq!(store.totals_in("count", Some(3600)).await["j"], 1.0);
    limiter.stop().await.expect("stop");
    // a fresh limiter reads the same
    let fresh = start(store, COUNTS).await;
    let read = fresh.rates("count", "k", None).await.expect("rates");
    assert_eq!(counts(&read), [(60, 3.5), (3600, 3.0)]);
    let read = fresh.rates("count", "j", Some(60)).await.expect("rates");
    assert_eq!(counts(&read), [(60, 1.0)]);
    fresh.stop().await.expect("stop");
}

/// One bad item (an empty key, a value that is no number, a window size the namespace
/// does not count in): an error, and none of the batch counted.
async fn an_increments_batch_with_a_bad_item_counts_nothing(store: &TestStore) {
    let limiter = start(store, COUNTS).await;
    let e = limiter
        .increments(
            &[("count", "k", Some(1.0), None), ("count", "", None, None)],
            10,
        )
        .await
        .expect_err("an empty key");
    assert!(matches!(e, Error::InvalidKey(_)), "{e:?}");
    assert!(e.to_string().starts_with("increments[1]: "), "{e}");
    let e = limiter
        .increments(
            &[
                ("count", "k", Some(1.0), None),
                ("count", "j", Some(f64::NAN), None),
            ],
            10,
        )
        .await
        .expect_err("not a number");
    assert!(e.to_string().starts_with("increments[1]: "), "{e}");
    let e = limiter
        .increments(
            &[
                ("count", "k", Some(1.0), None),
                ("count", "j", Some(1.0), Some(7)),
            ],
            10,
        )
        .await
        .expect_err("no such window size");
    assert!(matches!(e, Error::UnknownWindowSize(_)), "{e:?}");
    let e = limiter
        .increments(
            &[
                ("count", "k", Some(1.0), None),
                ("count", "j", Some(1.0), None),
            ],
            1,
        )
        .await
        .expect_err("more than max");
    assert!(matches!(e, Error::BadRequest(_)), "{e:?}");
    assert!(
        store.totals("count").await.is_empty(),
        "a refused batch counted"
    );
    let read = limiter.rates("count", "k", None).await.expect("rates");
    assert_eq!(counts(&read), [(60, 0.0), (3600, 0.0)]);
    limiter.stop().await.expect("stop");
    assert!(store.totals("count").await.is_empty());
}

async fn a_refund_gives_back_and_never_below_zero(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 3)).await;
    for _ in 0..3 {
        assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    assert!(!limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    let back = limiter.refund("api", "k", 2.0).await.expect("refund");
    assert_eq!(answered(&back, "refunded"), 2.0);
    assert_eq!(answered(&back, "remaining"), 2.0);
    assert_eq!(stored(store, "api", "k").await, 1.0);
    // more than is counted: what there is, no more
    let back = limiter.refund("api", "k", 5.0).await.expect("refund");
    assert_eq!(answered(&back, "refunded"), 1.0);
    assert_eq!(answered(&back, "remaining"), 3.0);
    assert_eq!(stored(store, "api", "k").await, 0.0);
    let back = limiter.refund("api", "k", 1.0).await.expect("refund");
    assert_eq!(answered(&back, "refunded"), 0.0);
    assert_eq!(stored(store, "api", "k").await, 0.0);
    // a key never hit
    let back = limiter.refund("api", "never", 1.0).await.expect("refund");
    assert_eq!(answered(&back, "refunded"), 0.0);
    // the whole limit again, and no more
    for _ in 0..3 {
        assert!(limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    }
    assert!(!limiter.hit("api", "k", 1.0).await.expect("hit").allowed());
    assert_eq!(stored(store, "api", "k").await, 3.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    assert_eq!(stored(store, "api", "never").await, 0.0);
}
