//! Overrun as debt, reservations over several keys, and extends while an answer
//! streams: each on PostgreSQL, SQLite and Redis, counts read back from the store.

use swin::error::Error;
use swin_testkit::TestStore;

use super::reservations::id;
use super::{hourly, replayed, settled, settled_key, start, stored};

swin_testkit::for_stores!([postgres, sqlite, redis] [
    a_commit_above_the_estimate_charges_all_of_it_as_debt,
    a_bucket_in_debt_denies_until_it_has_refilled,
    a_reserve_denied_by_one_key_spends_nothing_on_any,
    a_commit_settles_every_key_of_its_reservation_once,
    an_extend_adds_to_the_total_the_commit_settles_against,
    an_extend_of_a_reservation_not_open_counts_nothing,
    another_limiter_extends_and_commits_a_reservation_of_several_keys,
    bad_reservations_of_several_keys_are_refused_naming_the_field,
    strict_admission_charges_a_debt_past_any_hold,
]);

/// A namespace of 10 hits an hour on its keys, with `key` allowed 100.
fn two_limits(sync_rate: f64) -> String {
    format!(
        "{}overrides = [{{ keys = [\"tenant\"], limits = [{{ window_size = 3600, limit = 100 }}] }}]\n",
        hourly("api", sync_rate, 10)
    )
}

/// 5 of 10 spent, a reservation of 2 committed at 12: all 10 over the estimate are
/// charged (nothing uncharged), the key is 7 past its limit, and its hits and reserves
/// are denied, with a wait, until its windows bring it back under.
async fn a_commit_above_the_estimate_charges_all_of_it_as_debt(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 10)).await;
    assert!(limiter.hit("api", "k", 5.0).await.expect("hit").allowed());
    let r = limiter
        .reserve("api", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    let s = limiter
        .commit("api", "k", &id(&r), 12.0)
        .await
        .expect("commit");
    assert_eq!(
        (
            settled(&s, "charged"),
            settled(&s, "uncharged"),
            settled(&s, "given_back"),
            settled(&s, "debt")
        ),
        (10.0, 0.0, 0.0, 7.0),
        "{s:?}"
    );
    assert_eq!(s.after().decision().remaining, 0.0);
    assert_eq!(stored(store, "api", "k").await, 17.0);
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    assert!(!v.allowed(), "a key in debt admits nothing: {v:?}");
    let wait = v.decision().retry_after;
    assert!(wait.as_secs() > 0 && wait.as_secs() <= 7200, "{wait:?}");
    let r = limiter
        .reserve("api", &["k"], 1.0, None, None)
        .await
        .expect("reserve");
    assert!(!r.verdict().allowed() && r.reservation().is_none());
    assert_eq!(
        stored(store, "api", "k").await,
        17.0,
        "denied: nothing counted"
    );
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 17.0);
}

/// GCRA: a bucket of 10 (10 an hour), a reservation of 2 committed at 30: the TAT is
/// forced 28 further, 20 past the burst; nothing passes, even after a minute's refill.
async fn a_bucket_in_debt_denies_until_it_has_refilled(store: &TestStore) {
    let ns = "[[namespaces]]\nname = \"llm\"\nstore = \"main\"\nsync_rate = 0\n\
              algorithm = \"gcra\"\ngcra = { burst = 10, count = 10, period = \"1h\" }\n";
    let limiter = start(store, ns).await;
    let r = limiter
        .reserve("llm", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed());
    let s = limiter
        .commit("llm", "k", &id(&r), 30.0)
        .await
        .expect("commit");
    assert_eq!(
        (settled(&s, "charged"), settled(&s, "uncharged")),
        (28.0, 0.0),
        "{s:?}"
    );
    // 20 past the burst, less what refilled since the reserve (a unit is 6 minutes)
    assert!(
        settled(&s, "debt") > 19.0 && settled(&s, "debt") <= 20.0,
        "{s:?}"
    );
    let v = limiter.hit("llm", "k", 1.0).await.expect("hit");
    assert!(!v.allowed(), "{v:?}");
    // 21 units to refill before one passes: about 2 h 6 min
    let wait = v.decision().retry_after.as_secs();
    assert!((21 * 360 - 60..=21 * 360).contains(&wait), "{wait}");
    // another limiter over the store sees the debt too
    let other = start(store, ns).await;
    assert!(!other.hit("llm", "k", 1.0).await.expect("hit").allowed());
    limiter.stop().await.expect("stop");
    other.stop().await.expect("stop");
}

/// `a` has 9 of 10 spent: a reserve of 2 over `tenant` (100) and `a` is denied by `a`
/// and spends nothing on either; over `tenant` and `b` it passes on both.
async fn a_reserve_denied_by_one_key_spends_nothing_on_any(store: &TestStore) {
    let limiter = start(store, &two_limits(0.0)).await;
    assert!(limiter.hit("api", "a", 9.0).await.expect("hit").allowed());
    let keys = ["tenant", "a"];
    let r = limiter
        .reserve("api", &keys, 2.0, None, None)
        .await
        .expect("reserve");
    assert!(!r.verdict().allowed() && r.reservation().is_none(), "{r:?}");
    let each: Vec<bool> = r.verdicts().iter().map(|(_, v)| v.allowed()).collect();
    assert_eq!(each, [true, false], "tenant had room, a had not");
    assert_eq!(stored(store, "api", "tenant").await, 0.0);
    assert_eq!(stored(store, "api", "a").await, 9.0);
    let keys = ["tenant", "b"];
    let r = limiter
        .reserve("api", &keys, 2.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed() && r.reservation().is_some(), "{r:?}");
    assert_eq!(r.total(), 2.0);
    assert_eq!(stored(store, "api", "tenant").await, 2.0);
    assert_eq!(stored(store, "api", "b").await, 2.0);
    limiter.stop().await.expect("stop");
}

/// A reservation of 4 over `tenant` and `b` committed at 1 gives 3 back on each; at 13
/// it would be 9 over on each: `b` (limit 10) is 3 past its limit, `tenant` is not.
/// Once: a second commit, or a commit of it through one key alone, settles nothing.
async fn a_commit_settles_every_key_of_its_reservation_once(store: &TestStore) {
    let limiter = start(store, &two_limits(0.0)).await;
    let keys = ["tenant", "b"];
    let r = limiter
        .reserve("api", &keys, 4.0, None, None)
        .await
        .expect("reserve");
    let rid = id(&r);
    let e = limiter
        .commit("api", "b", &rid, 1.0)
        .await
        .expect_err("not of b alone");
    assert!(matches!(e, Error::UnknownReservation(_)), "{e:?}");
    let all = limiter
        .commit_reservation("api", &rid, 1.0)
        .await
        .expect("commit");
    let got: Vec<(String, f64, f64)> = all
        .iter()
        .map(|s| {
            (
                settled_key(s),
                settled(&s, "given_back"),
                settled(&s, "charged"),
            )
        })
        .collect();
    assert_eq!(got, [("tenant".into(), 3.0, 0.0), ("b".into(), 3.0, 0.0)]);
    assert_eq!(stored(store, "api", "tenant").await, 1.0);
    assert_eq!(stored(store, "api", "b").await, 1.0);
    let again = limiter
        .commit_reservation("api", &rid, 1.0)
        .await
        .expect("settled once, told again");
    assert!(again.iter().all(|s| replayed(&s)), "{again:?}");
    assert_eq!(stored(store, "api", "tenant").await, 1.0);
    // debt on the key whose limit the overrun passes, not on the other
    let r = limiter
        .reserve("api", &keys, 4.0, None, None)
        .await
        .expect("reserve");
    let all = limiter
        .commit_reservation("api", &id(&r), 13.0)
        .await
        .expect("commit");
    let got: Vec<(String, f64, f64)> = all
        .iter()
        .map(|s| (settled_key(s), settled(&s, "charged"), settled(&s, "debt")))
        .collect();
    assert_eq!(got, [("tenant".into(), 9.0, 0.0), ("b".into(), 9.0, 4.0)]);
    assert_eq!(stored(store, "api", "tenant").await, 14.0);
    assert_eq!(stored(store, "api", "b").await, 14.0);
    limiter.stop().await.expect("stop");
}

/// A reservation of 2, extended by 3 (allowed: 5 counted), then by 6 (denied: the
/// limit is 10; it stays at 5), committed at 4 against its total of 5: 1 given back.
async fn an_extend_adds_to_the_total_the_commit_settles_against(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 10)).await;
    let r = limiter
        .reserve("api", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    let rid = id(&r);
    let x = limiter
        .extend("api", Some("k"), &rid, 3.0)
        .await
        .expect("extend");
    assert!(x.verdict().allowed(), "{x:?}");
    assert_eq!(x.total(), 5.0);
    assert_eq!(stored(store, "api", "k").await, 5.0);
    let x = limiter
        .extend("api", Some("k"), &rid, 6.0)
        .await
        .expect("extend");
    assert!(!x.verdict().allowed(), "{x:?}");
    assert_eq!(x.total(), 5.0, "denied: the reservation keeps what it had");
    assert_eq!(stored(store, "api", "k").await, 5.0);
    let s = limiter.commit("api", "k", &rid, 4.0).await.expect("commit");
    assert_eq!(
        (
            settled(&s, "estimate"),
            settled(&s, "given_back"),
            settled(&s, "charged")
        ),
        (5.0, 1.0, 0.0)
    );
    assert_eq!(stored(store, "api", "k").await, 4.0);
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "api", "k").await, 4.0);
}

/// An extend of a reservation committed, lapsed or never made is 404 and counts
/// nothing.
async fn an_extend_of_a_reservation_not_open_counts_nothing(store: &TestStore) {
    let limiter = start(store, &hourly("api", 0.0, 10)).await;
    let r = limiter
        .reserve("api", &["k"], 2.0, Some(0.2), None)
        .await
        .expect("reserve");
    let lapsing = id(&r);
    let r = limiter
        .reserve("api", &["k"], 1.0, None, None)
        .await
        .expect("reserve");
    let committed = id(&r);
    limiter
        .commit("api", "k", &committed, 1.0)
        .await
        .expect("commit");
    // the first lapses by its ttl (store time: waiting for it, not asserting on it)
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    for rid in [
        lapsing.as_str(),
        committed.as_str(),
        "00000000000000000000000000000000",
    ] {
        let e = limiter
            .extend("api", Some("k"), rid, 1.0)
            .await
            .expect_err("not open");
        assert!(matches!(e, Error::UnknownReservation(_)), "{rid}: {e:?}");
    }
    assert_eq!(stored(store, "api", "k").await, 3.0);
    let e = limiter
        .commit("api", "k", &lapsing, 0.0)
        .await
        .expect_err("lapsed at its total");
    assert!(matches!(e, Error::UnknownReservation(_)), "{e:?}");
    assert_eq!(stored(store, "api", "k").await, 3.0);
    limiter.stop().await.expect("stop");
}

async fn another_limiter_extends_and_commits_a_reservation_of_several_keys(store: &TestStore) {
    let a = start(store, &two_limits(0.0)).await;
    let b = start(store, &two_limits(0.0)).await;
    let keys = ["tenant", "u"];
    let r = a
        .reserve("api", &keys, 2.0, None, None)
        .await
        .expect("reserve");
    let rid = id(&r);
    let x = b.extend("api", None, &rid, 3.0).await.expect("extend on b");
    assert!(x.verdict().allowed());
    assert_eq!(x.total(), 5.0);
    let all = a
        .commit_reservation("api", &rid, 5.0)
        .await
        .expect("commit on a");
    assert!(all
        .iter()
        .all(|s| settled(&s, "estimate") == 5.0 && settled(&s, "charged") == 0.0));
    let again = b
        .commit_reservation("api", &rid, 5.0)
        .await
        .expect("settled on a, told again");
    assert!(again.iter().all(|s| replayed(&s)), "{again:?}");
    assert_eq!(stored(store, "api", "tenant").await, 5.0);
    assert_eq!(stored(store, "api", "u").await, 5.0);
    a.stop().await.expect("stop");
    b.stop().await.expect("stop");
}

async fn bad_reservations_of_several_keys_are_refused_naming_the_field(store: &TestStore) {
    let limiter = start(store, &two_limits(0.0)).await;
    let k = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let many: Vec<String> = (0..=16) // one past the most keys a reservation holds
        .map(|i| format!("k{i}"))
        .collect();
    for (keys, field) in [
        (k(&[]), "keys:"),
        (k(&["a", "b", "a"]), "keys[2]:"),
        (k(&["a", ""]), "keys[1]:"),
        (many, "keys:"),
    ] {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let e = limiter
            .reserve("api", &keys, 1.0, None, None)
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(field), "{field}: {e}");
        assert!(
            matches!(e, Error::BadRequest(_) | Error::InvalidKey(_)),
            "{e:?}"
        );
    }
    let e = limiter
        .reserve("api", &["a"], -1.0, None, None)
        .await
        .expect_err("a negative cost");
    assert!(e.to_string().contains("cost"), "{e}");
    for bad in ["", "xyz", "0123456789abcdef0123456789abcdeg"] {
        let e = limiter
            .commit_reservation("api", bad, 1.0)
            .await
            .expect_err("not an id");
        assert!(
            matches!(&e, Error::BadRequest(m) if m.starts_with("reservation:")),
            "{e:?}"
        );
    }
    assert_eq!(stored(store, "api", "a").await, 0.0);
    assert_eq!(stored(store, "api", "b").await, 0.0);
    limiter.stop().await.expect("stop");
}

/// Strict admission (windows, then a GCRA bucket): a debt larger than any hold or grant
/// is counted as eventual admission counts and pushed; the key is denied after it and
/// the store holds every unit once the limiter stops.
async fn strict_admission_charges_a_debt_past_any_hold(store: &TestStore) {
    let windows = "[[namespaces]]\nname = \"w\"\nstore = \"main\"\nsync_rate = 1\n\
                   window_sizes = [3600]\nlimits = [{ window_size = 3600, limit = 10 }]\n\
                   admission = \"strict\"\n";
    let limiter = start(store, windows).await;
    let r = limiter
        .reserve("w", &["k"], 4.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed(), "{r:?}");
    let s = limiter
        .commit("w", "k", &id(&r), 40.0)
        .await
        .expect("commit");
    assert_eq!(
        (settled(&s, "charged"), settled(&s, "uncharged")),
        (36.0, 0.0),
        "{s:?}"
    );
    assert!(!limiter.hit("w", "k", 1.0).await.expect("hit").allowed());
    limiter.stop().await.expect("stop");
    assert_eq!(stored(store, "w", "k").await, 40.0);

    let bucket = "[[namespaces]]\nname = \"g\"\nstore = \"main\"\nsync_rate = 1\n\
                  algorithm = \"gcra\"\ngcra = { burst = 10, count = 10, period = \"1h\" }\n\
                  admission = \"strict\"\n";
    let limiter = start(store, bucket).await;
    let r = limiter
        .reserve("g", &["k"], 2.0, None, None)
        .await
        .expect("reserve");
    assert!(r.verdict().allowed(), "{r:?}");
    let s = limiter
        .commit("g", "k", &id(&r), 30.0)
        .await
        .expect("commit");
    assert_eq!(
        (settled(&s, "charged"), settled(&s, "uncharged")),
        (28.0, 0.0),
        "{s:?}"
    );
    let v = limiter.hit("g", "k", 1.0).await.expect("hit");
    assert!(
        !v.allowed(),
        "units granted before the debt pass no more: {v:?}"
    );
    limiter.stop().await.expect("stop");
    let other = start(store, bucket).await;
    let v = other.hit("g", "k", 1.0).await.expect("hit");
    assert!(!v.allowed(), "the store holds the debt: {v:?}");
    other.stop().await.expect("stop");
}
