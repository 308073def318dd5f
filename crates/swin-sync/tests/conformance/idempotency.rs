//! Idempotency records: one claim wins whatever races, a record answers its first
//! answer until it lapses, only its claim keeps or releases it, namespaces are apart,
//! and the caps hold (a full namespace writes nothing, its records still answer; a
//! client past its share writes nothing, others still claim).

use swin_core::UnixMs;
use swin_sync::store::{Claim, Claimed, ClientShare, Fingerprint, Record};
use swin_testkit::TestStore;

const T: i64 = 1_800_000_000_000;

fn claim<'a>(key: &'a str, f: &'a Fingerprint, token: i64, now: i64, max: u64) -> Claim<'a> {
    Claim {
        key,
        fingerprint: f,
        token,
        held_until: UnixMs(now + 5_000),
        expires_at: UnixMs(now + 60_000),
        now: UnixMs(now),
        max_records: max,
        client: None,
    }
}

/// `claim` by `client`, who may hold `share` records.
fn claim_by<'a>(
    key: &'a str,
    f: &'a Fingerprint,
    token: i64,
    now: i64,
    client: &'a str,
    share: u64,
) -> Claim<'a> {
    Claim {
        client: Some(ClientShare {
            client,
            max_records: share,
        }),
        ..claim(key, f, token, now, 100)
    }
}

pub async fn idempotency_claims_race_to_one_winner_and_answer_again(s: &TestStore) {
    let f = Fingerprint([1; 32]);
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = s.store.clone();
            tokio::spawn(async move {
                let c = claim("7:keys/k:retry-1", &f, i, T, 100);
                (i, store.claim_idempotency("ns", c).await.expect("claim"))
            })
        })
        .collect();
    let mut mine = Vec::new();
    for t in tasks {
        let (token, c) = t.await.expect("task");
        match c {
            Claimed::Mine => mine.push(token),
            Claimed::Found(r) => assert_eq!(r, Record::InFlight { fingerprint: f }),
            Claimed::Full | Claimed::ClientFull => panic!("not full"),
        }
    }
    assert_eq!(mine.len(), 1, "{mine:?}");
    let st = &s.store;
    let key = "7:keys/k:retry-1";
    // only the holder keeps its answer, once
    assert!(!st
        .keep_answer("ns", key, mine[0] + 100, b"no", UnixMs(T))
        .await
        .expect("keep"));
    let answer = b"\x00\xc8 the first answer, bytes \xff".to_vec();
    assert!(st
        .keep_answer("ns", key, mine[0], &answer, UnixMs(T + 1))
        .await
        .expect("keep"));
    assert!(!st
        .keep_answer("ns", key, mine[0], b"again", UnixMs(T + 2))
        .await
        .expect("keep"));
    assert!(
        !st.release_claim("ns", key, mine[0]).await.expect("release"),
        "answered"
    );
    let again = st
        .claim_idempotency("ns", claim(key, &Fingerprint([2; 32]), 99, T + 3, 100))
        .await
        .expect("again");
    assert_eq!(
        again,
        Claimed::Found(Record::Answered {
            fingerprint: f,
            answer: answer.clone()
        }),
        "the first fingerprint and answer, whatever the retry sent"
    );
    // the same key in another namespace is another record
    let other = st
        .claim_idempotency("ns2", claim(key, &f, 5, T + 3, 100))
        .await
        .expect("other");
    assert_eq!(other, Claimed::Mine);
    assert_eq!(
        st.idempotency_records("ns", UnixMs(T + 3))
            .await
            .expect("n"),
        1
    );
    assert_eq!(
        st.idempotency_records("ns2", UnixMs(T + 3))
            .await
            .expect("n"),
        1
    );
    // lapsed at T + 60 s: claimed anew
    let late = st
        .claim_idempotency("ns", claim(key, &f, 7, T + 60_000, 100))
        .await
        .expect("late");
    assert_eq!(late, Claimed::Mine);
}

pub async fn idempotency_claims_released_or_held_no_longer_run_again(s: &TestStore) {
    let st = &s.store;
    let f = Fingerprint([3; 32]);
    assert_eq!(
        st.claim_idempotency("ns", claim("r", &f, 1, T, 10))
            .await
            .expect("c"),
        Claimed::Mine
    );
    // a release by another token changes nothing; by the holder, the record goes
    assert!(!st.release_claim("ns", "r", 2).await.expect("release"));
    assert!(st.release_claim("ns", "r", 1).await.expect("release"));
    assert!(
        !st.release_claim("ns", "r", 1).await.expect("release"),
        "once"
    );
    assert_eq!(st.idempotency_records("ns", UnixMs(T)).await.expect("n"), 0);
    assert_eq!(
        st.claim_idempotency("ns", claim("r", &f, 3, T + 1, 10))
            .await
            .expect("c"),
        Claimed::Mine
    );
    // held until T + 1 + 5 s: in flight before, taken over after (the old holder's
    // answer is then refused)
    let during = st
        .claim_idempotency("ns", claim("r", &f, 4, T + 5_000, 10))
        .await
        .expect("c");
    assert_eq!(during, Claimed::Found(Record::InFlight { fingerprint: f }));
    let after = st
        .claim_idempotency("ns", claim("r", &f, 5, T + 5_002, 10))
        .await
        .expect("c");
    assert_eq!(after, Claimed::Mine);
    assert!(!st
        .keep_answer("ns", "r", 3, b"late", UnixMs(T + 5_003))
        .await
        .expect("keep"));
    assert!(st
        .keep_answer("ns", "r", 5, b"new", UnixMs(T + 5_003))
        .await
        .expect("keep"));
    assert_eq!(
        st.idempotency_records("ns", UnixMs(T + 5_003))
            .await
            .expect("n"),
        1
    );
}

pub async fn idempotency_records_are_capped_and_purged_when_lapsed(s: &TestStore) {
    let st = &s.store;
    let f = Fingerprint([4; 32]);
    for i in 0..3 {
        let key = format!("k{i}");
        let c = st
            .claim_idempotency("ns", claim(&key, &f, i, T, 3))
            .await
            .expect("c");
        assert_eq!(c, Claimed::Mine, "{key}");
    }
    assert!(st
        .keep_answer("ns", "k0", 0, b"a0", UnixMs(T))
        .await
        .expect("keep"));
    // full: a new key writes nothing; a kept one still answers; another namespace has room
    let full = st
        .claim_idempotency("ns", claim("k3", &f, 3, T + 1, 3))
        .await
        .expect("c");
    assert_eq!(full, Claimed::Full);
    let kept = st
        .claim_idempotency("ns", claim("k0", &f, 9, T + 1, 3))
        .await
        .expect("c");
    assert!(
        matches!(kept, Claimed::Found(Record::Answered { .. })),
        "{kept:?}"
    );
    assert_eq!(
        st.claim_idempotency("ns2", claim("k3", &f, 3, T + 1, 3))
            .await
            .expect("c"),
        Claimed::Mine
    );
    assert_eq!(
        st.idempotency_records("ns", UnixMs(T + 1))
            .await
            .expect("n"),
        3
    );
    // a released claim makes room
    assert!(st.release_claim("ns", "k2", 2).await.expect("release"));
    assert_eq!(
        st.claim_idempotency("ns", claim("k3", &f, 3, T + 2, 3))
            .await
            .expect("c"),
        Claimed::Mine
    );
    assert_eq!(
        st.claim_idempotency("ns", claim("k4", &f, 4, T + 2, 3))
            .await
            .expect("c"),
        Claimed::Full
    );
    // once they lapse (T + 60 s), new keys fit again, without waiting for a purge
    let later = T + 60_002;
    assert_eq!(
        st.claim_idempotency("ns", claim("k5", &f, 5, later, 3))
            .await
            .expect("c"),
        Claimed::Mine
    );
    assert_eq!(
        st.idempotency_records("ns", UnixMs(later))
            .await
            .expect("n"),
        1
    );
    // the purge deletes what lapsed (a store that expires records itself says 0)
    let purged = st
        .purge_idempotency(UnixMs(T + 200_000))
        .await
        .expect("purge");
    assert!(purged <= 4, "{purged}");
    assert_eq!(
        st.idempotency_records("ns", UnixMs(T + 200_000))
            .await
            .expect("n"),
        0
    );
    assert_eq!(
        st.idempotency_records("ns2", UnixMs(T + 200_000))
            .await
            .expect("n"),
        0
    );
    for i in 0..3 {
        let key = format!("n{i}");
        let c = st
            .claim_idempotency("ns", claim(&key, &f, i, T + 200_000, 3))
            .await
            .expect("c");
        assert_eq!(
            c,
            Claimed::Mine,
            "{key}: the purged records no longer count"
        );
    }
}

pub async fn idempotency_clients_hold_their_share_and_no_more(s: &TestStore) {
    let st = &s.store;
    let f = Fingerprint([5; 32]);
    let by = async |key: &str, token: i64, now: i64, client: &str| {
        st.claim_idempotency("ns", claim_by(key, &f, token, now, client, 2))
            .await
            .expect("claim")
    };
    assert_eq!(by("k0", 0, T, "x").await, Claimed::Mine);
    assert_eq!(by("k1", 1, T, "x").await, Claimed::Mine);
    // x holds its 2: its new key writes nothing; its kept ones answer; y has room
    assert_eq!(by("k2", 2, T, "x").await, Claimed::ClientFull);
    assert_eq!(
        by("k0", 9, T, "x").await,
        Claimed::Found(Record::InFlight { fingerprint: f })
    );
    assert_eq!(by("k2", 3, T, "y").await, Claimed::Mine);
    // a released claim gives its client room again
    assert!(st.release_claim("ns", "k1", 1).await.expect("release"));
    assert_eq!(by("k3", 4, T + 1, "x").await, Claimed::Mine);
    assert_eq!(by("k4", 5, T + 1, "x").await, Claimed::ClientFull);
    assert_eq!(
        st.idempotency_records("ns", UnixMs(T + 1))
            .await
            .expect("n"),
        3,
        "k0 and k3 of x, k2 of y"
    );
    // once they lapse (T + 60 s), its new keys fit again
    assert_eq!(by("k5", 6, T + 60_002, "x").await, Claimed::Mine);
    assert_eq!(by("k6", 7, T + 60_002, "x").await, Claimed::Mine);
    assert_eq!(by("k7", 8, T + 60_002, "x").await, Claimed::ClientFull);

    // racing claims of one client on distinct keys: its share, exactly
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = s.store.clone();
            tokio::spawn(async move {
                let key = format!("race-{i}");
                let c = Claim {
                    client: Some(ClientShare {
                        client: "z",
                        max_records: 5,
                    }),
                    ..claim(&key, &f, i, T, 100)
                };
                store.claim_idempotency("ns3", c).await.expect("claim")
            })
        })
        .collect();
    let mut mine = 0;
    for t in tasks {
        match t.await.expect("task") {
            Claimed::Mine => mine += 1,
            Claimed::ClientFull => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(mine, 5);
}

/// A client's count of records goes with its last record: once every record of many
/// clients lapsed and was purged, the SQL stores keep no row for them (a row per address
/// ever seen would grow without end), and each client claims its share again.
pub async fn idempotency_client_counts_go_with_their_records(s: &TestStore) {
    let st = &s.store;
    let f = Fingerprint([6; 32]);
    for i in 0..20 {
        let (key, client) = (format!("k{i}"), format!("client-{i}"));
        let c = claim_by(&key, &f, i, T, &client, 1);
        assert_eq!(
            st.claim_idempotency("ns", c).await.expect("claim"),
            Claimed::Mine
        );
    }
    let kept = "SELECT count(*) FROM swin_idempotency_client_counts";
    if let Some(n) = s.sql_number(kept).await {
        assert_eq!(n, 20, "one row per client holding a record");
    }
    let later = T + 120_000;
    st.purge_idempotency(UnixMs(later)).await.expect("purge");
    if let Some(n) = s.sql_number(kept).await {
        assert_eq!(n, 0, "no row for a client holding none");
    }
    let c = claim_by("again", &f, 99, later, "client-3", 1);
    assert_eq!(
        st.claim_idempotency("ns", c).await.expect("claim"),
        Claimed::Mine
    );
    let c = claim_by("again-2", &f, 100, later, "client-3", 1);
    assert_eq!(
        st.claim_idempotency("ns", c).await.expect("claim"),
        Claimed::ClientFull
    );
}

/// An answer kept, or a claim released, whose reply is lost after the store applied it
/// and which is sent again: the record holds the first answer (a retry of the request
/// is answered with it), or is gone once (a retry runs the request) — nothing is kept
/// or released twice, and no other claim's record is touched.
pub async fn an_idempotency_answer_whose_reply_is_lost_is_kept_once(s: &TestStore) {
    let (store, faults) = crate::common::faulty(&s.store);
    let f = Fingerprint([7; 32]);
    let mine = |key, token| claim(key, &f, token, T, 100);
    assert_eq!(
        store
            .claim_idempotency("ns", mine("kept", 1))
            .await
            .expect("c"),
        Claimed::Mine
    );
    faults.plan([swin_sync::store::Fault::FailAfter]);
    let lost = store
        .keep_answer("ns", "kept", 1, b"first", UnixMs(T + 1))
        .await;
    assert!(lost.is_err(), "the reply lost: {lost:?}");
    // sent again: the record is answered already (by this very claim)
    let again = store
        .keep_answer("ns", "kept", 1, b"first", UnixMs(T + 1))
        .await;
    again.expect("again");
    let retry = store
        .claim_idempotency("ns", mine("kept", 2))
        .await
        .expect("c");
    assert_eq!(
        retry,
        Claimed::Found(Record::Answered {
            fingerprint: f,
            answer: b"first".to_vec(),
        })
    );
    assert_eq!(
        store
            .claim_idempotency("ns", mine("gone", 3))
            .await
            .expect("c"),
        Claimed::Mine
    );
    faults.plan([swin_sync::store::Fault::FailAfter]);
    assert!(
        store.release_claim("ns", "gone", 3).await.is_err(),
        "the reply lost"
    );
    assert!(
        !store.release_claim("ns", "gone", 3).await.expect("again"),
        "gone once"
    );
    assert_eq!(
        store
            .claim_idempotency("ns", mine("gone", 4))
            .await
            .expect("c"),
        Claimed::Mine
    );
    assert_eq!(
        store
            .idempotency_records("ns", UnixMs(T + 1))
            .await
            .expect("n"),
        2
    );
}

/// A claim through an engine that fails to its caller — answered past `answer_within`
/// (its call still running), or failed after the store took it (its reply lost) — is
/// released in the background once the store has answered: the caller ran nothing under
/// it, and a retry then claims the record at once instead of finding it in flight until
/// its hold lapses. A claim that found another's record writes nothing and releases
/// nothing.
pub async fn an_idempotency_claim_that_failed_to_its_caller_is_released(s: &TestStore) {
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    use swin_core::{CounterOptions, NamespaceCounters};
    use swin_sync::store::Fault;
    use swin_sync::{NamespaceSync, StoreError, SyncMode};

    let engine = || {
        let (faulty, faults) = super::common::faulty(&s.store);
        let counters = Arc::new(NamespaceCounters::new("ns", &[], CounterOptions::default()));
        let e = NamespaceSync::new(
            counters,
            SyncMode::Synchronous,
            Some(faulty),
            swin_sync::new_node_id().into(),
            Duration::from_secs(5),
        )
        .answering_within(Duration::from_millis(100));
        (Arc::new(e), faults)
    };
    let f = Fingerprint([3; 32]);
    // the record's times in the cluster's clock (held 5 s): the release gives up past
    // the hold
    let now = swin_sync::now().0;
    let retry_runs = async |key: &str| {
        let t = Instant::now();
        loop {
            let c = s
                .store
                .claim_idempotency("ns", claim(key, &f, 99, now, 100))
                .await
                .expect("claim");
            match c {
                Claimed::Mine => return,
                Claimed::Found(r) => assert_eq!(r, Record::InFlight { fingerprint: f }),
                Claimed::Full | Claimed::ClientFull => panic!("not full"),
            }
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{key}: still in flight, not released"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    // answered late: the caller is told it timed out; the record is in flight meanwhile
    let (e, faults) = engine();
    faults.plan([Fault::Slow(Duration::from_millis(400))]);
    let t = Instant::now();
    let r = e.claim_idempotency(claim("late", &f, 1, now, 100)).await;
    assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
    assert!(
        t.elapsed() < Duration::from_millis(350),
        "{:?}",
        t.elapsed()
    );
    let meanwhile = s
        .store
        .claim_idempotency("ns", claim("late", &f, 2, now, 100))
        .await
        .expect("claim");
    assert_eq!(
        meanwhile,
        Claimed::Found(Record::InFlight { fingerprint: f })
    );
    retry_runs("late").await;

    // taken, then its reply lost
    let (e, faults) = engine();
    faults.plan([Fault::FailAfter]);
    let r = e.claim_idempotency(claim("lost", &f, 1, now, 100)).await;
    assert!(matches!(r, Err(StoreError::Injected)), "{r:?}");
    retry_runs("lost").await;

    // a claim that finds a live record and answers late releases nothing: the record
    // stays its holder's (token 99 above), its answer kept
    let (e, faults) = engine();
    faults.plan([Fault::Slow(Duration::from_millis(200))]);
    let r = e.claim_idempotency(claim("lost", &f, 5, now, 100)).await;
    assert!(matches!(r, Err(StoreError::Timeout(_))), "{r:?}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(s
        .store
        .keep_answer("ns", "lost", 99, b"kept", UnixMs(now + 1))
        .await
        .expect("keep"));
    let found = s
        .store
        .claim_idempotency("ns", claim("lost", &f, 6, now, 100))
        .await
        .expect("claim");
    assert_eq!(
        found,
        Claimed::Found(Record::Answered {
            fingerprint: f,
            answer: b"kept".to_vec()
        })
    );
}
