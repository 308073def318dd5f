//! What only the Redis store has: its push script's checks, and its script cache, on
//! each server it runs on (Debian's Redis, Valkey 9, Redis 8).

use super::*;

/// Redis runs a script without rolling it back: the push script checks every window
/// before its first write. A stored count that is not a number (written by hand) used to
/// fail the script after the windows before it were added, with the sequence number not
/// recorded, so every retry added them again. Now that window is refused alone, the
/// others are applied, and a retry applies nothing.
pub(super) async fn redis_push_checks_before_writing_and_a_retry_applies_once(s: &TestStore) {
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
pub(super) async fn redis_pushes_survive_a_flushed_script_cache(s: &TestStore) {
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
/// previous window) writes no field, and a push whose windows only read writes nothing,
/// not even its exactly-once record (a retry of it changes nothing either).
pub(super) async fn redis_pushes_write_what_changed_and_every_hash_expires(s: &TestStore) {
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
        ("z", vec![]),
    ] {
        let hash = format!("{}:{{2:ns:{key}}}:60", r.prefix());
        let mut fields: Vec<String> = ::redis::cmd("HKEYS")
            .arg(&hash)
            .query_async(&mut conn)
            .await
            .expect("hkeys");
        fields.sort();
        assert_eq!(fields, want, "{hash}");
        if want.is_empty() {
            continue;
        }
        let ttl: i64 = ::redis::cmd("TTL")
            .arg(&hash)
            .query_async(&mut conn)
            .await
            .expect("ttl");
        assert!(ttl > 0, "{hash} has no expiry: {ttl}");
    }
}

/// A counter push is deduplicated per hash: on one server a call takes up to 64 hashes
/// of any slots, and a retry finds each hash's record whatever the hashes that share its
/// call. A batch retried with more hashes than reached the store (an earlier attempt that
/// stopped after its first call, say) applies the new ones and only those.
pub(super) async fn redis_a_retry_applies_each_hash_once_however_it_is_grouped(s: &TestStore) {
    let node = PushId::from("n");
    let first = [diff("a", CUR, 1.0), diff("b", CUR, 2.0)];
    s.store
        .push("ns", push(&node, 7, &first))
        .await
        .expect("push");
    // seq 7 again: a and b are in it already, c and d are not
    let again = [
        diff("a", CUR, 1.0),
        diff("b", CUR, 2.0),
        diff("c", CUR, 3.0),
        diff("d", CUR, 4.0),
    ];
    for _ in 0..2 {
        let reply = s
            .store
            .push("ns", push(&node, 7, &again))
            .await
            .expect("retry");
        let mut counts: Vec<(String, f64)> = reply
            .totals
            .iter()
            .map(|t| (t.key.to_string(), t.count))
            .collect();
        counts.sort_by(|x, y| x.0.cmp(&y.0));
        let want: Vec<(String, f64)> = [("a", 1.0), ("b", 2.0), ("c", 3.0), ("d", 4.0)]
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        assert_eq!(counts, want, "each hash applied once");
    }
    // the next seq applies to every hash, those recorded by seq 7 included
    let next = [diff("a", CUR, 1.0), diff("d", CUR, 1.0)];
    s.store
        .push("ns", push(&node, 8, &next))
        .await
        .expect("push");
    let keys = ["a", "b", "c", "d"].map(|k| wk(k, CUR));
    assert_eq!(
        totals(&s.store, "ns", &keys).await,
        vec![
            ("a".into(), CUR, 2.0),
            ("b".into(), CUR, 2.0),
            ("c".into(), CUR, 3.0),
            ("d".into(), CUR, 5.0),
        ]
    );
}

/// A node's push record that is not a number (written by hand) used to fail every push
/// that touched its hash, holding back every diff behind it for good. It now counts as
/// no record: the push applies, and its own record replaces the bad one.
pub(super) async fn redis_a_push_record_that_is_not_a_number_does_not_stop_pushes(s: &TestStore) {
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
        .arg("n:n")
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .expect("corrupt");
    let node = PushId::from("n");
    let d = [diff("k", CUR, 2.0), diff("j", CUR, 1.0)];
    for _ in 0..2 {
        let reply = s.store.push("ns", push(&node, 3, &d)).await.expect("push");
        assert!(reply.rejected.is_empty(), "{reply:?}");
    }
    let keys = [wk("j", CUR), wk("k", CUR)];
    assert_eq!(
        totals(&s.store, "ns", &keys).await,
        vec![("j".into(), CUR, 1.0), ("k".into(), CUR, 2.0)],
        "applied once, the retry recognised"
    );
    let record: String = ::redis::cmd("HGET")
        .arg(&hash)
        .arg("n:n")
        .query_async(&mut conn)
        .await
        .expect("record");
    assert_eq!(record, "3");

    // the same for a GCRA bucket's record
    let bucket = format!("{}:{{2:ns:b}}:gcra", r.prefix());
    let _: () = ::redis::cmd("HSET")
        .arg(&bucket)
        .arg("n:n1")
        .arg("not a number")
        .query_async(&mut conn)
        .await
        .expect("corrupt");
    let advances = [adv("b", 1)];
    for _ in 0..2 {
        s.store
            .push_tats("ns", tat_push(Some(4), NOW_NS, &advances))
            .await
            .expect("tat push");
    }
    assert_eq!(tat_of(&s.store, "ns", "b").await, Some(NOW_NS + SEC));
}

/// A periodic sync reads the windows of the keys it pushes in the push itself: the
/// script's HMGET of a key's hash takes its other window too. A node holding only keys
/// it pushes makes one store call a sync (there was one read more per hash after the
/// push: here the planned failure of a second call failed the sync), and its view has
/// the other node's hits of the previous window.
pub(super) async fn redis_a_sync_reads_its_pushed_keys_in_the_push(s: &TestStore) {
    let b = engine(
        &s.store,
        SyncMode::Periodic(Duration::from_millis(100)),
        &[60],
    );
    let then = UnixMs::from_secs(NOW - 60);
    b.increment("k", 60, 5.0, then).await.expect("b");
    b.sync_once(then).await.expect("sync b");
    let (faulty, control) = common::faulty(&s.store);
    let a = engine(
        &faulty,
        SyncMode::Periodic(Duration::from_millis(100)),
        &[60],
    );
    let now = UnixMs::from_secs(NOW);
    a.sync_once(now)
        .await
        .expect("a first sync: the store reached");
    for key in ["k", "other"] {
        a.increment(key, 60, 3.0, now).await.expect("a");
    }
    control.plan([Fault::Slow(Duration::ZERO), Fault::FailBefore]);
    a.sync_once(now).await.expect("one call: the push");
    control.clear_plan();
    let r = a.counters().rate("k", 60, now, None).expect("size");
    assert_eq!((r.current, r.previous), (3.0, 5.0), "{r:?}");
    let r = a.counters().rate("other", 60, now, None).expect("size");
    assert_eq!((r.current, r.previous), (3.0, 0.0), "{r:?}");
    assert_eq!(
        totals(&s.store, "api", &[wk("k", CUR), wk("k", PREV)]).await,
        vec![("k".into(), PREV, 5.0), ("k".into(), CUR, 3.0)]
    );
}

swin_testkit::for_stores!([redis, valkey, redis8] [
    redis_a_sync_reads_its_pushed_keys_in_the_push,
    redis_push_checks_before_writing_and_a_retry_applies_once,
    redis_pushes_survive_a_flushed_script_cache,
    redis_pushes_write_what_changed_and_every_hash_expires,
    redis_a_retry_applies_each_hash_once_however_it_is_grouped,
    redis_a_push_record_that_is_not_a_number_does_not_stop_pushes
]);
