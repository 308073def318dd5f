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
