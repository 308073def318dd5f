//! The table's reads and changes against a store that answers late or fails.

use std::sync::atomic::AtomicUsize;

use swin_core::{CounterOptions, NamespaceCounters, Retention, WindowSize};
use swin_sync::SyncMode;

use super::*;

fn namespace() -> NamespaceSync {
    let counters = Arc::new(NamespaceCounters::new(
        "api",
        &[WindowSize::new(3600).expect("size")],
        CounterOptions {
            retention: Retention::LocalOnly,
            max_counters: 100,
        },
    ));
    NamespaceSync::new(
        counters,
        SyncMode::LocalOnly,
        None,
        swin_sync::PushId::new("test"),
        Duration::from_secs(1),
    )
}

fn stored(limit: u32) -> StoredLimit {
    StoredLimit {
        key: "k".into(),
        limits: format!(r#"{{"limits":[{{"window_size":3600,"limit":{limit}}}]}}"#),
        expires_at: None,
        set_by: "test".into(),
        set_at: UnixMs(0),
    }
}

fn held(limits: &RuntimeLimits) -> Option<String> {
    limits.get("k", UnixMs(1)).map(|r| r.stored.limits.clone())
}

#[tokio::test]
async fn a_read_a_change_overtook_is_made_again_and_kept() {
    let sync = namespace();
    let limits = RuntimeLimits::for_algorithm(Algorithm::SlidingWindow);
    let reads = AtomicUsize::new(0);
    limits
        .read_and_keep(&sync, &["k"], || async {
            if reads.fetch_add(1, Ordering::SeqCst) == 0 {
                // the watcher forgets keys while the first read is out; that read
                // answers what the store held before the change
                limits.remember("other", None);
                Ok(vec![])
            } else {
                Ok(vec![stored(3)])
            }
        })
        .await
        .expect("read");
    assert_eq!(reads.load(Ordering::SeqCst), 2);
    assert_eq!(held(&limits), Some(stored(3).limits));
}

#[tokio::test]
async fn a_read_that_never_settles_keeps_nothing_stale() {
    let sync = namespace();
    let limits = RuntimeLimits::for_algorithm(Algorithm::SlidingWindow);
    let reads = AtomicUsize::new(0);
    limits
        .read_and_keep(&sync, &["k"], || async {
            reads.fetch_add(1, Ordering::SeqCst);
            limits.remember("other", None);
            Ok(vec![stored(7)])
        })
        .await
        .expect("read");
    assert_eq!(reads.load(Ordering::SeqCst), READS);
    assert_eq!(held(&limits), None);
    assert!(!limits.entries.pin().contains_key("k"), "left to be read");
}

#[tokio::test]
async fn a_quiet_read_is_kept_at_once() {
    let sync = namespace();
    let limits = RuntimeLimits::for_algorithm(Algorithm::SlidingWindow);
    let reads = AtomicUsize::new(0);
    limits
        .read_and_keep(&sync, &["k"], || async {
            reads.fetch_add(1, Ordering::SeqCst);
            Ok(vec![stored(5)])
        })
        .await
        .expect("read");
    assert_eq!(reads.load(Ordering::SeqCst), 1);
    assert_eq!(held(&limits), Some(stored(5).limits));
}

fn changes(keys: &[&str], cursor: &str) -> swin_sync::store::LimitChanges {
    swin_sync::store::LimitChanges {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        cursor: cursor.into(),
        complete: true,
    }
}

fn cursor(limits: &RuntimeLimits) -> Option<String> {
    limits.cursor.lock().expect("cursor").clone()
}

#[tokio::test]
async fn a_change_read_while_the_store_fails_keeps_what_was_read_and_the_cursor() {
    let sync = namespace();
    let limits = RuntimeLimits::for_algorithm(Algorithm::SlidingWindow);
    let two = stored(2);
    let parsed = parse(
        &two,
        Algorithm::SlidingWindow,
        &sync.counters().window_sizes().collect::<Vec<_>>(),
    )
    .expect("limits");
    limits.remember(
        "k",
        Some(RuntimeLimit {
            limits: parsed,
            stored: two.clone(),
        }),
    );
    *limits.cursor.lock().expect("cursor") = Some("1".into());
    let failed = limits
        .apply_changes(&sync, changes(&["k"], "2"), |keys| async move {
            assert_eq!(keys, ["k"]);
            Err(swin_sync::StoreError::Injected)
        })
        .await;
    assert!(failed.is_err());
    assert_eq!(
        held(&limits),
        Some(two.limits),
        "the store went away: k keeps its 2"
    );
    assert_eq!(
        cursor(&limits).as_deref(),
        Some("1"),
        "the change is asked for again"
    );
    // the store is back: the same changes, read this time
    let n = limits
        .apply_changes(&sync, changes(&["k"], "2"), |_| async {
            Ok(vec![stored(3)])
        })
        .await
        .expect("read");
    assert_eq!(n, 1);
    assert_eq!(held(&limits), Some(stored(3).limits));
    assert_eq!(cursor(&limits).as_deref(), Some("2"));
}
