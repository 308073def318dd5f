//! Runtime limits: kept per key, listed in key order, and every change logged so that
//! another node learns which keys to read again.

use swin_core::UnixMs;
use swin_sync::store::StoredLimit;
use swin_testkit::TestStore;

fn limit(key: &str, n: u32, expires_at: Option<i64>) -> StoredLimit {
    StoredLimit {
        key: key.to_owned(),
        limits: format!(r#"{{"limits":[{{"window_size":60,"limit":{n}}}]}}"#),
        expires_at: expires_at.map(UnixMs),
        set_by: "ops".into(),
        set_at: UnixMs(1_763_784_000_000),
    }
}

/// A deadline no change here reaches.
const LATER: UnixMs = UnixMs(i64::MAX);

/// The limits as JSON values (PostgreSQL's jsonb writes them its own way).
fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).expect("json")
}

pub async fn runtime_limits_round_trip_and_log_every_change(s: &TestStore) {
    let st = &s.store;
    let start = st.limit_changes("ns", None).await.expect("head");
    assert!(start.complete && start.keys.is_empty());

    // odd keys: separators, braces, a long one
    let keys = ["tenant-1", "a{b}:c|d=e", "é", &"k".repeat(900)];
    for (i, k) in keys.iter().enumerate() {
        st.put_limit("ns", &limit(k, i as u32 + 1, None), LATER)
            .await
            .expect("put");
    }
    st.put_limit("other", &limit("tenant-1", 99, None), LATER)
        .await
        .expect("put in another namespace");
    let read = st
        .read_limits("ns", &["tenant-1", "é", "nobody"])
        .await
        .expect("read");
    let mut read: Vec<_> = read.into_iter().map(|l| (l.key.clone(), l)).collect();
    read.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(read.len(), 2, "{read:?}");
    let tenant = &read.iter().find(|r| r.0 == "tenant-1").expect("tenant").1;
    assert_eq!(json(&tenant.limits), json(&limit("x", 1, None).limits));
    assert_eq!(tenant.set_by, "ops");
    assert_eq!(tenant.set_at, UnixMs(1_763_784_000_000));
    assert_eq!(tenant.expires_at, None);

    // the log names every key changed since the head, in order, then nothing more
    let changes = st
        .limit_changes("ns", Some(&start.cursor))
        .await
        .expect("changes");
    assert!(changes.complete);
    assert_eq!(changes.keys, keys.map(str::to_owned).to_vec());
    let none = st
        .limit_changes("ns", Some(&changes.cursor))
        .await
        .expect("no changes");
    assert!(none.complete && none.keys.is_empty(), "{none:?}");
    assert_eq!(none.cursor, changes.cursor);

    // replaced, then deleted: both logged; a second delete finds nothing, logs nothing
    st.put_limit("ns", &limit("tenant-1", 7, Some(4_000_000_000_000)), LATER)
        .await
        .expect("replace");
    assert!(st.delete_limit("ns", "é", LATER).await.expect("delete"));
    assert!(!st
        .delete_limit("ns", "é", LATER)
        .await
        .expect("delete again"));
    let later = st
        .limit_changes("ns", Some(&changes.cursor))
        .await
        .expect("changes");
    assert_eq!(later.keys, vec!["tenant-1".to_owned(), "é".to_owned()]);
    let read = st
        .read_limits("ns", &["tenant-1", "é"])
        .await
        .expect("read");
    assert_eq!(read.len(), 1);
    assert_eq!(read[0].expires_at, Some(UnixMs(4_000_000_000_000)));
    assert_eq!(
        json(&st.read_limits("other", &["tenant-1"]).await.expect("other")[0].limits),
        json(&limit("x", 99, None).limits),
        "another namespace keeps its own"
    );
}

pub async fn runtime_limits_list_in_key_order_without_lapsed_ones(s: &TestStore) {
    let st = &s.store;
    let now = UnixMs(1_763_784_000_000);
    for i in (0..25).rev() {
        // every fifth lapsed a second ago
        let expires = (i % 5 == 0).then_some(now.0 - 1_000);
        st.put_limit("ns", &limit(&format!("k{i:02}"), i, expires), LATER)
            .await
            .expect("put");
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = st
            .list_limits("ns", after.as_deref(), 7, now)
            .await
            .expect("list");
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 7);
        after = page.last().map(|l| l.key.clone());
        seen.extend(page.into_iter().map(|l| l.key));
    }
    let want: Vec<String> = (0..25)
        .filter(|i| i % 5 != 0)
        .map(|i| format!("k{i:02}"))
        .collect();
    assert_eq!(seen, want);
    // a read of a lapsed one (not cleared yet, or cleared by a later write) never
    // answers it as live
    let lapsed = st.read_limits("ns", &["k05"]).await.expect("read");
    assert!(lapsed.iter().all(|l| !l.live_at(now)), "{lapsed:?}");
}

/// A page asked after a key no stored one can equal (U+0000 in it, which PostgreSQL's
/// text cannot hold) goes on from where that key would sort, in the bytes' order: not
/// from the first key again (a client paging would see the same keys for ever), and not
/// in the database's collation (upper case before lower in the bytes).
pub async fn a_page_after_any_key_goes_on_from_where_it_sorts(s: &TestStore) {
    let st = &s.store;
    let now = UnixMs(1_763_784_000_000);
    for key in ["B", "a", "b", "c"] {
        st.put_limit("ns", &limit(key, 1, None), LATER)
            .await
            .expect("put");
    }
    let keys = |page: Vec<StoredLimit>| page.into_iter().map(|l| l.key).collect::<Vec<_>>();
    let page = st.list_limits("ns", Some("b\0x"), 10, now).await;
    assert_eq!(keys(page.expect("list")), ["c"]);
    let page = st.list_limits("ns", Some("B"), 10, now).await;
    assert_eq!(keys(page.expect("list")), ["a", "b", "c"]);
    let page = st.list_limits("ns", None, 10, now).await;
    assert_eq!(keys(page.expect("list")), ["B", "a", "b", "c"]);
    // and a read of such a key finds none
    let read = st.read_limits("ns", &["b\0x", "c"]).await.expect("read");
    assert_eq!(keys(read), ["c"]);
}

pub async fn a_cursor_the_store_cannot_reach_back_to_is_incomplete(s: &TestStore) {
    let st = &s.store;
    st.put_limit("ns", &limit("a", 1, None), LATER)
        .await
        .expect("put");
    let head = st.limit_changes("ns", None).await.expect("head");
    // a cursor ahead of the store's head: the store lost its changes (a new database)
    let ahead = match s.store.kind() {
        swin_sync::store::StoreKind::Redis | swin_sync::store::StoreKind::RedisCluster => {
            "99999999999999-0".to_owned()
        }
        _ => "1000000".to_owned(),
    };
    let lost = st.limit_changes("ns", Some(&ahead)).await.expect("changes");
    assert!(!lost.complete, "{lost:?}");
    assert!(lost.keys.is_empty());
    assert_eq!(
        lost.cursor, head.cursor,
        "the caller starts again from the head"
    );
    assert!(st.limit_changes("ns", Some("garbage")).await.is_err());
}

/// A change the store takes after its deadline (by the store's own clock) is not applied
/// and says so: the node that sent it stopped waiting and told its client nothing changed.
pub async fn a_change_past_its_deadline_is_not_applied(s: &TestStore) {
    let st = &s.store;
    let start = st.limit_changes("ns", None).await.expect("head");
    let past = UnixMs(swin_sync::now().0 - 60_000);
    let e = st
        .put_limit("ns", &limit("late", 1, None), past)
        .await
        .expect_err("too late");
    assert!(matches!(e, swin_sync::StoreError::TooLate), "{e:?}");
    assert!(st
        .read_limits("ns", &["late"])
        .await
        .expect("read")
        .is_empty());
    st.put_limit("ns", &limit("kept", 2, None), LATER)
        .await
        .expect("put");
    let e = st
        .delete_limit("ns", "kept", past)
        .await
        .expect_err("too late");
    assert!(matches!(e, swin_sync::StoreError::TooLate), "{e:?}");
    assert_eq!(
        st.read_limits("ns", &["kept"]).await.expect("read").len(),
        1
    );
    let changes = st
        .limit_changes("ns", Some(&start.cursor))
        .await
        .expect("changes");
    assert_eq!(
        changes.keys,
        vec!["kept".to_owned()],
        "only the change applied is logged"
    );
}

/// A ping answers with the store's clock where it has one of its own, close to the
/// node's here (one machine); SQLite's is the node's.
pub async fn a_ping_tells_the_stores_time(s: &TestStore) {
    let before = swin_sync::clock::system_now();
    let t = s.store.ping().await.expect("ping");
    let after = swin_sync::clock::system_now();
    match s.store.kind().name() {
        "sqlite" => assert_eq!(t, None),
        kind => {
            let t = t.unwrap_or_else(|| panic!("{kind}: a time"));
            assert!(
                t.0 >= before.0 - 1_000 && t.0 <= after.0 + 1_000,
                "{kind}: {t:?} not within a second of {before:?}..{after:?}"
            );
        }
    }
}
