//! What only Redis has: its push script's checks, and its script cache.

use super::*;

/// Redis runs a script without rolling it back: the push script checks every window
/// before its first write. A stored count that is not a number (written by hand) used to
/// fail the script after the windows before it were added, with the sequence number not
/// recorded, so every retry added them again. Now that window is refused alone, the
/// others are applied, and a retry applies nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn redis_push_checks_before_writing_and_a_retry_applies_once() {
    let s = TestStore::redis();
    let Store::Redis(r) = &s.store else {
        unreachable!("a redis store")
    };
    let client = ::redis::Client::open(s.url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let hash = format!("{}:{{2:ns:k}}:60", r.prefix());
    let _: () = ::redis::cmd("HSET")
        .arg(&hash)
        .arg(CUR)
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .expect("corrupt");
    // one hash, so one script call: the previous window first, then the corrupt one
    let d = [diff("k", PREV, 1.0), diff("k", CUR, 1.0)];
    for _ in 0..3 {
        let reply = s
            .store
            .push("ns", push(&PushId::from("n"), 1, &d))
            .await
            .expect("no error");
        assert_eq!(reply.rejected.len(), 1, "{reply:?}");
    }
    let prev: String = ::redis::cmd("HGET")
        .arg(&hash)
        .arg(PREV)
        .query_async(&mut conn)
        .await
        .expect("read");
    assert_eq!(prev, "1", "applied once, not once per retry");
}

/// The push scripts are loaded once, not before every push; a server that lost them (a
/// restart, SCRIPT FLUSH) answers NOSCRIPT, and the push loads them again and applies
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn redis_pushes_survive_a_flushed_script_cache() {
    let s = TestStore::redis();
    let st = &s.store;
    st.push("ns", push(&PushId::from("n"), 1, &[diff("k", CUR, 1.0)]))
        .await
        .expect("push");
    let client = ::redis::Client::open(s.url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = ::redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut conn)
        .await
        .expect("flush");
    st.push("ns", push(&PushId::from("n"), 2, &[diff("k", CUR, 2.0)]))
        .await
        .expect("push after the flush");
    let advances = [adv("b", 1)];
    st.push_tats("ns", tat_push(Some(3), NOW_NS, &advances))
        .await
        .expect("tat push after the flush");
    assert_eq!(
        totals(st, "ns", &[wk("k", CUR)]).await,
        vec![("k".into(), CUR, 3.0)]
    );
}

/// The push script writes only what changed and never leaves a hash without an expiry:
/// a window that opens sets the hash's TTL, a diff of 0 (a synchronous read of the
/// previous window) writes no field, and a push whose windows only read still leaves its
/// exactly-once record in a hash that expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
pub(super) async fn redis_pushes_write_what_changed_and_every_hash_expires() {
    let s = TestStore::redis();
    let Store::Redis(r) = &s.store else {
        unreachable!("a redis store")
    };
    let client = ::redis::Client::open(s.url.as_str()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let node = PushId::from("n");
    let d = [diff("a", CUR, 1.0), diff("a", PREV, 0.0)];
    let pushed = s.store.push("ns", push(&node, 1, &d)).await.expect("push");
    let mut counts: Vec<(i64, f64)> = pushed
        .totals
        .iter()
        .map(|t| (t.window_start, t.count))
        .collect();
    counts.sort_by_key(|c| c.0);
    assert_eq!(counts, vec![(PREV, 0.0), (CUR, 1.0)]);
    let z = [diff("z", CUR, 0.0)];
    let pushed = s.store.push("ns", push(&node, 2, &z)).await.expect("push");
    assert_eq!(pushed.totals.len(), 1);
    assert_eq!(pushed.totals[0].count, 0.0);
    for (key, want) in [
        ("a", vec![CUR.to_string(), "n:n".to_string()]),
        ("z", vec!["n:n".to_string()]),
    ] {
        let hash = format!("{}:{{2:ns:{key}}}:60", r.prefix());
        let mut fields: Vec<String> = ::redis::cmd("HKEYS")
            .arg(&hash)
            .query_async(&mut conn)
            .await
            .expect("hkeys");
        fields.sort();
        assert_eq!(fields, want, "{hash}");
        let ttl: i64 = ::redis::cmd("TTL")
            .arg(&hash)
            .query_async(&mut conn)
            .await
            .expect("ttl");
        assert!(ttl > 0, "{hash} has no expiry: {ttl}");
    }
}
