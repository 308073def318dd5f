//! Reserve, then commit, over the router, on local-only namespaces (`login`: 5 a
//! minute; `orders`: a GCRA bucket of 3; both `overrun = "cap"`): the shapes and
//! headers, a commit that gives back or charges the difference (never past the limit:
//! overrun as debt is in `budgets`), a commit that settles once,
//! a reservation that lapses at its estimate, and every bad input a 400 or 404 that
//! changes nothing.

use axum::http::StatusCode;
use serde_json::Value;

use super::{counted, current, router, send, Answer};

async fn post(r: &axum::Router, ns: &str, key: &str, op: &str, body: &str) -> Answer {
    send(
        r,
        "POST",
        &format!("/v1/namespaces/{ns}/keys/{key}/{op}"),
        &[],
        body,
    )
    .await
}

fn id(v: &Value) -> String {
    v["reservation"].as_str().expect("reservation").to_owned()
}

fn commit_body(id: &str, cost: f64) -> String {
    format!(r#"{{"reservation":"{id}","cost":{cost}}}"#)
}

#[tokio::test]
async fn a_reserve_spends_the_estimate_and_a_commit_settles_the_difference_once() {
    let r = router().await;
    let (s, a, h) = post(&r, "login", "k", "reserve", r#"{"cost":3,"ttl":60}"#).await;
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!(
        (
            a["allowed"].clone(),
            a["cost"].clone(),
            a["remaining"].clone()
        ),
        (true.into(), 3.0.into(), 2.0.into()),
        "{a}"
    );
    let first = id(&a);
    assert!(
        first.len() == 32 && first.bytes().all(|b| b.is_ascii_hexdigit()),
        "the id is 128 random bits in hex: {first}"
    );
    assert!(a["expires_at"].as_f64().expect("expires_at") > 1.7e9, "{a}");
    assert_eq!(h[0].as_deref(), Some("\"60s\";q=5;w=60"));
    assert!(
        h[1].as_deref().unwrap_or("").starts_with("\"60s\";r=2;t="),
        "{h:?}"
    );
    assert_eq!(current(&r, "login", "k", 60).await, 3.0);

    // the estimate counts against the limit at once, as a hit would
    let (s, d, h) = post(&r, "login", "k", "reserve", r#"{"cost":3}"#).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{d}");
    assert_eq!(d["allowed"], false);
    assert!(d.get("reservation").is_none(), "{d}");
    assert!(h[2].is_some(), "Retry-After on a denied reserve");
    assert_eq!(current(&r, "login", "k", 60).await, 3.0);

    // it cost 1: 2 given back
    let (s, c, _) = post(&r, "login", "k", "commit", &commit_body(&first, 1.0)).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(c["committed"], true);
    assert_eq!(c["reservation"], first.as_str());
    assert_eq!(
        [
            &c["estimate"],
            &c["cost"],
            &c["charged"],
            &c["given_back"],
            &c["uncharged"]
        ],
        [
            &Value::from(3.0),
            &1.0.into(),
            &0.0.into(),
            &2.0.into(),
            &0.0.into()
        ],
        "{c}"
    );
    assert_eq!(c["remaining"], 4.0, "{c}");
    assert_eq!(current(&r, "login", "k", 60).await, 1.0);

    // the same commit again (its answer was lost): told how it was settled, settles
    // nothing; at another cost, 409
    let (s, e, _) = post(&r, "login", "k", "commit", &commit_body(&first, 1.0)).await;
    assert_eq!((s, &e["replayed"]), (StatusCode::OK, &true.into()), "{e}");
    let (s, e, _) = post(&r, "login", "k", "commit", &commit_body(&first, 0.0)).await;
    assert_eq!(
        (s, e["error"]["code"].clone()),
        (StatusCode::CONFLICT, "already_committed".into())
    );
    assert_eq!(current(&r, "login", "k", 60).await, 1.0);

    // more than estimated: charged up to the limit, the rest reported, never counted
    let (s, a, _) = post(&r, "login", "k", "reserve", r#"{"cost":2}"#).await;
    assert_eq!(s, StatusCode::OK, "{a}");
    let second = id(&a);
    let (s, c, h) = post(&r, "login", "k", "commit", &commit_body(&second, 6.5)).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        [
            &c["charged"],
            &c["given_back"],
            &c["uncharged"],
            &c["remaining"]
        ],
        [&Value::from(2.0), &0.0.into(), &2.5.into(), &0.0.into()],
        "{c}"
    );
    assert!(
        h[1].as_deref().unwrap_or("").starts_with("\"60s\";r=0;t="),
        "{h:?}"
    );
    assert_eq!(current(&r, "login", "k", 60).await, 5.0);

    // other keys are not affected
    assert_eq!(current(&r, "login", "other", 60).await, 0.0);
    let (s, _, _) = post(&r, "login", "other", "reserve", r#"{"cost":5}"#).await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn a_reservation_is_settled_once_whichever_way_and_a_gcra_bucket_too() {
    let r = router().await;
    // exactly the estimate: nothing moves
    let (_, a, _) = post(&r, "login", "even", "reserve", r#"{"cost":2}"#).await;
    let (s, c, _) = post(&r, "login", "even", "commit", &commit_body(&id(&a), 2.0)).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        [&c["charged"], &c["given_back"]],
        [&Value::from(0.0), &0.0.into()]
    );
    assert_eq!(current(&r, "login", "even", 60).await, 2.0);

    // a GCRA bucket of 3: 2 reserved, 0 used → all back
    let (s, a, _) = post(&r, "orders", "o", "reserve", r#"{"cost":2}"#).await;
    assert_eq!(
        (s, a["remaining"].clone()),
        (StatusCode::OK, 1.0.into()),
        "{a}"
    );
    let (s, c, _) = post(&r, "orders", "o", "commit", &commit_body(&id(&a), 0.0)).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        (c["given_back"].clone(), c["remaining"].clone()),
        (2.0.into(), 3.0.into()),
        "{c}"
    );
    // 1 reserved, 5 used: 2 more charged (the bucket's room), 2 uncharged
    let (_, a, _) = post(&r, "orders", "o", "reserve", r#"{"cost":1}"#).await;
    let (s, c, _) = post(&r, "orders", "o", "commit", &commit_body(&id(&a), 5.0)).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    assert_eq!(
        [&c["charged"], &c["uncharged"], &c["remaining"]],
        [&Value::from(2.0), &2.0.into(), &0.0.into()],
        "{c}"
    );
    let (s, _, _) = post(&r, "orders", "o", "reserve", r#"{"cost":1}"#).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    // a fractional cost cannot settle a bucket of whole tokens
    let (_, a, _) = post(&r, "orders", "p", "reserve", r#"{"cost":1}"#).await;
    let (s, e, _) = post(&r, "orders", "p", "commit", &commit_body(&id(&a), 0.5)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("cost"),
        "{e}"
    );
    // … and that refusal did not end it
    let (s, c, _) = post(&r, "orders", "p", "commit", &commit_body(&id(&a), 1.0)).await;
    assert_eq!(s, StatusCode::OK, "{c}");
}

#[tokio::test]
async fn a_reservation_not_committed_by_its_ttl_stays_at_its_estimate() {
    let r = router().await;
    let (_, a, _) = post(&r, "login", "late", "reserve", r#"{"cost":4,"ttl":0.2}"#).await;
    let late = id(&a);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, e, _) = post(&r, "login", "late", "commit", &commit_body(&late, 1.0)).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{e}");
    assert_eq!(e["error"]["code"], "unknown_reservation");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("lapsed"),
        "{e}"
    );
    assert_eq!(counted(&r, "login", "late", 60).await, 4.0);
}

#[tokio::test]
async fn bad_reserves_and_commits_are_refused_naming_the_problem_and_change_nothing() {
    let r = router().await;
    let (s, a, _) = post(&r, "login", "k", "reserve", r#"{"cost":2}"#).await;
    assert_eq!(s, StatusCode::OK);
    let good = id(&a);
    let random = good.as_str();
    // the form ids had when they carried their estimate: taken, and not open
    let forged = format!("{random}.0");
    let cases: Vec<(&str, &str, String, StatusCode, &str)> = vec![
        (
            "login",
            "reserve",
            "".into(),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "reserve",
            r#"{"ttl":5}"#.into(),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":-1}"#.into(),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":6}"#.into(),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":"3"}"#.into(),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":1,"ttl":0}"#.into(),
            StatusCode::BAD_REQUEST,
            "ttl",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":1,"ttl":-3}"#.into(),
            StatusCode::BAD_REQUEST,
            "ttl",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":1,"ttl":1e300}"#.into(),
            StatusCode::BAD_REQUEST,
            "ttl",
        ),
        (
            "login",
            "reserve",
            r#"{"cost":1,"lease":"x"}"#.into(),
            StatusCode::BAD_REQUEST,
            "lease",
        ),
        (
            "orders",
            "reserve",
            r#"{"cost":1.5}"#.into(),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "api",
            "reserve",
            r#"{"cost":1}"#.into(),
            StatusCode::BAD_REQUEST,
            "no limits",
        ),
        (
            "slots",
            "reserve",
            r#"{"cost":1}"#.into(),
            StatusCode::BAD_REQUEST,
            "no limits",
        ),
        (
            "nope",
            "reserve",
            r#"{"cost":1}"#.into(),
            StatusCode::NOT_FOUND,
            "nope",
        ),
        (
            "login",
            "commit",
            r#"{"cost":1}"#.into(),
            StatusCode::BAD_REQUEST,
            "reservation",
        ),
        (
            "login",
            "commit",
            format!(r#"{{"reservation":"{good}"}}"#),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "commit",
            commit_body(&good, -1.0),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "commit",
            format!(r#"{{"reservation":"{good}","cost":1e300}}"#),
            StatusCode::BAD_REQUEST,
            "cost",
        ),
        (
            "login",
            "commit",
            commit_body("nothex", 1.0),
            StatusCode::BAD_REQUEST,
            "reservation",
        ),
        (
            "login",
            "commit",
            commit_body(&format!("{random}.x"), 1.0),
            StatusCode::BAD_REQUEST,
            "reservation",
        ),
        (
            "login",
            "commit",
            commit_body(&format!("{random}.-5"), 1.0),
            StatusCode::BAD_REQUEST,
            "reservation",
        ),
        (
            "login",
            "commit",
            commit_body(&format!("{random}.1e9"), 1.0),
            StatusCode::BAD_REQUEST,
            "reservation",
        ),
        (
            "login",
            "commit",
            commit_body(&forged, 0.0),
            StatusCode::NOT_FOUND,
            "not open",
        ),
        (
            "login",
            "commit",
            format!(r#"{{"reservation":"{good}","cost":1,"x":1}}"#),
            StatusCode::BAD_REQUEST,
            "x",
        ),
    ];
    for (ns, op, body, status, names) in cases {
        let (s, e, _) = post(&r, ns, "k", op, &body).await;
        assert_eq!(s, status, "{ns} {op} {body}: {e}");
        let msg = e["error"]["message"].as_str().unwrap_or("");
        assert!(msg.contains(names), "{ns} {op} {body}: {e}");
        assert_eq!(current(&r, "login", "k", 60).await, 2.0, "{ns} {op} {body}");
    }
    // the reservation's id on another key is unknown there
    let (s, e, _) = post(&r, "login", "other", "commit", &commit_body(&good, 0.0)).await;
    assert_eq!(
        (s, e["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, "unknown_reservation".into())
    );
    // and still good on its own
    let (s, c, _) = post(&r, "login", "k", "commit", &commit_body(&good, 0.0)).await;
    assert_eq!(
        (s, c["given_back"].clone()),
        (StatusCode::OK, 2.0.into()),
        "{c}"
    );
    assert_eq!(current(&r, "login", "k", 60).await, 0.0);
}
