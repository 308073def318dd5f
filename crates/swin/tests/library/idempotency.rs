//! Idempotent retries through `Limiter::once`: a request runs once per idempotency key,
//! on any limiter over the store; a retry answers the first answer and counts nothing;
//! another request under the key is refused; a failure is not kept; a retry of a request
//! still running waits, then says so; a client holds its share of the records and no
//! more; a batch's record goes to its first namespace with a store.

use std::sync::Arc;
use std::time::Duration;

use swin::error::Error;
use swin::idempotency::{Answer, Idempotent, Once};
use swin_testkit::TestStore;

use super::{hourly, start, stored};

swin_testkit::for_stores!([sqlite, redis] [
    a_retry_on_another_limiter_answers_the_first_answer_and_counts_nothing,
    another_request_under_a_key_is_refused_and_failures_run_again,
    a_retry_of_a_request_still_running_waits_then_says_so,
    a_client_holds_its_share_across_limiters_and_others_still_run,
    a_batch_record_goes_to_its_first_namespace_with_a_store,
]);

fn asked(key: &str, body: &str) -> Idempotent {
    Idempotent::new("api", "keys/k/hit", key.as_bytes(), "POST", body.as_bytes()).expect("key")
}

/// A hit of `k`, answered as its status and remaining.
async fn hit(limiter: Arc<super::Running>) -> Answer {
    let v = limiter.hit("api", "k", 1.0).await.expect("hit");
    let status = if v.allowed() { 200 } else { 429 };
    Answer::new(
        status,
        vec![("x".into(), b"y".to_vec())],
        v.decision().remaining.to_string().into_bytes(),
    )
}

async fn a_retry_on_another_limiter_answers_the_first_answer_and_counts_nothing(store: &TestStore) {
    let one = Arc::new(start(store, &hourly("api", 0.0, 10)).await);
    let two = Arc::new(start(store, &hourly("api", 0.0, 10)).await);
    let first = one
        .once(asked("r-1", "{}"), hit(one.clone()))
        .await
        .expect("first");
    assert!(!matches!(first, Once::Again(_)));
    hit(two.clone()).await;
    for l in [&two, &one] {
        let again = l
            .once(asked("r-1", "{}"), hit(l.clone()))
            .await
            .expect("again");
        assert_eq!(again, Once::Again(first.answer().clone()));
    }
    assert_eq!(stored(store, "api", "k").await, 2.0);
}

async fn another_request_under_a_key_is_refused_and_failures_run_again(store: &TestStore) {
    let l = Arc::new(start(store, &hourly("api", 0.0, 10)).await);
    l.once(asked("r-2", "{}"), hit(l.clone()))
        .await
        .expect("first");
    let e = l
        .once(asked("r-2", "{\"cost\":2}"), hit(l.clone()))
        .await
        .expect_err("reused");
    assert!(matches!(e, Error::IdempotencyKeyReused(_)), "{e:?}");
    // a failure (5xx) is not kept: the retry runs
    let failed = l
        .once(asked("r-3", "{}"), async {
            Answer::new(503, vec![], vec![])
        })
        .await;
    assert_eq!(failed.expect("answered").answer().status(), 503);
    let retried = l
        .once(asked("r-3", "{}"), hit(l.clone()))
        .await
        .expect("retry");
    assert!(!matches!(retried, Once::Again(_)) && retried.answer().status() == 200);
    // a denial is an answer: kept
    let denied = l
        .once(asked("r-4", "{}"), async {
            Answer::new(429, vec![], b"no".to_vec())
        })
        .await;
    assert_eq!(denied.expect("answered").answer().status(), 429);
    let again = l
        .once(asked("r-4", "{}"), hit(l.clone()))
        .await
        .expect("again");
    assert!(matches!(again, Once::Again(_)) && again.answer().status() == 429);
    assert_eq!(stored(store, "api", "k").await, 2.0);
}

async fn a_retry_of_a_request_still_running_waits_then_says_so(store: &TestStore) {
    let l = Arc::new(start(store, &hourly("api", 0.0, 10)).await);
    let (go, wait) = tokio::sync::oneshot::channel::<()>();
    let slow = {
        let l = l.clone();
        tokio::spawn(async move {
            let run = async move {
                let _ = wait.await;
                Answer::new(200, vec![], b"late".to_vec())
            };
            l.once(asked("r-5", "{}"), run).await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let e = l
        .once(asked("r-5", "{}"), hit(l.clone()))
        .await
        .expect_err("in flight");
    assert!(matches!(e, Error::IdempotencyInProgress(_)), "{e:?}");
    go.send(()).expect("go");
    let first = slow.await.expect("task").expect("first");
    let again = l
        .once(asked("r-5", "{}"), hit(l.clone()))
        .await
        .expect("again");
    assert_eq!(again, Once::Again(first.answer().clone()));
    assert_eq!(stored(store, "api", "k").await, 0.0, "the hits never ran");
}

async fn a_client_holds_its_share_across_limiters_and_others_still_run(store: &TestStore) {
    let config = format!(
        "{}idempotency_max_keys = 10\nidempotency_max_keys_per_client = 3\n",
        hourly("api", 0.0, 100)
    );
    let one = Arc::new(start(store, &config).await);
    let two = Arc::new(start(store, &config).await);
    let (greedy, other) = (
        swin::Client::Token("greedy".into()),
        swin::Client::Token("other".into()),
    );
    let mut ran = 0;
    for i in 0..8 {
        let l = if i % 2 == 0 { &one } else { &two };
        let a = asked(&format!("g-{i}"), "{}").by(&greedy);
        match l.once(a, hit(l.clone())).await {
            Ok(o) => {
                assert!(!matches!(o, Once::Again(_)));
                ran += 1;
            }
            Err(Error::Exhausted(m)) => {
                assert!(m.contains("idempotency_max_keys_per_client"), "{m}")
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(ran, 3);
    let a = asked("o-1", "{}").by(&other);
    let room = two.once(a, hit(two.clone())).await.expect("room");
    assert!(matches!(room, Once::First(_)));
    let kept = asked("g-0", "{}").by(&greedy);
    let kept = one.once(kept, hit(one.clone())).await.expect("kept");
    assert!(matches!(kept, Once::Again(_)));
    assert_eq!(stored(store, "api", "k").await, 4.0);
}

async fn a_batch_record_goes_to_its_first_namespace_with_a_store(store: &TestStore) {
    let local = "[[namespaces]]\nname = \"here\"\nwindow_sizes = [3600]\nsync_rate = -1\n";
    let config = format!("{}{}", local, hourly("api", 0.0, 100));
    let l = start(store, &config).await;
    assert_eq!(
        l.record_namespace(["here", "api"]).expect("one"),
        Some("api")
    );
    assert_eq!(
        l.record_namespace(["api", "here"]).expect("one"),
        Some("api")
    );
    assert_eq!(l.record_namespace(["nowhere", "api"]).expect("none"), None);
    assert_eq!(l.record_namespace([]).expect("none"), None);
    let e = l.record_namespace(["here", "here"]).expect_err("refused");
    assert!(
        matches!(&e, Error::BadRequest(m) if m.contains("Idempotency-Key")),
        "{e}"
    );
}
