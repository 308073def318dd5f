//! Concurrency leases over the router, on a local-only namespace (`slots`: 2 in flight
//! per key): the contract's shapes and headers, a release that frees a slot at once, a
//! lease that ends once, renewals, lapses, and every bad input a 400 that changes nothing.

use axum::http::StatusCode;

use super::{call, router, send, Answer};

const KEY: &str = "/v1/namespaces/slots/keys/k";

async fn post(r: &axum::Router, path: &str, body: &str) -> Answer {
    send(r, "POST", &format!("{KEY}/{path}"), &[], body).await
}

#[tokio::test]
async fn leases_admit_up_to_the_limit_and_a_release_frees_a_slot_at_once() {
    let r = router().await;
    let (s, a, h) = post(&r, "acquire", "").await;
    assert_eq!(s, StatusCode::OK, "{a}");
    assert_eq!(
        (
            a["allowed"].clone(),
            a["in_flight"].clone(),
            a["limit"].clone()
        ),
        (true.into(), 1.into(), 2.into())
    );
    let first = a["lease"].as_str().expect("lease").to_owned();
    assert_eq!(first.len(), 32, "{a}");
    assert!(a["expires_at"].as_f64().expect("expires_at") > 1.7e9, "{a}");
    assert_eq!(h[0].as_deref(), Some("\"concurrency\";q=2"));
    assert_eq!(h[1].as_deref(), Some("\"concurrency\";r=1"));
    assert_eq!(h[2], None);

    let (s, b, _) = post(&r, "acquire", r#"{"count":1,"ttl":10}"#).await;
    assert_eq!(
        (s, b["in_flight"].clone()),
        (StatusCode::OK, 2.into()),
        "{b}"
    );
    let second = b["lease"].as_str().expect("lease").to_owned();
    assert_ne!(first, second);

    // the gauge of slots in flight (this node's leases: the namespace is local only)
    let (_, m) = call(&r, "GET", "/metrics", None, "").await;
    let m = m.as_str().expect("metrics");
    assert!(
        m.contains("swin_leases_in_flight{namespace=\"slots\"} 2\n"),
        "{m}"
    );

    // full: 429 with when to try again
    let (s, d, h) = post(&r, "acquire", "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{d}");
    assert_eq!(d["allowed"], false);
    assert_eq!(d["in_flight"], 2);
    assert!(d.get("lease").is_none(), "{d}");
    let retry = d["retry_after"].as_f64().expect("retry_after");
    assert!(
        retry > 9.0 && retry <= 10.0,
        "the earliest lapse, 10 s away: {d}"
    );
    assert_eq!(h[1].as_deref(), Some("\"concurrency\";r=0;t=10"));
    assert_eq!(h[2].as_deref(), Some("10"));
    // other keys are not affected
    let (s, _, _) = send(
        &r,
        "POST",
        "/v1/namespaces/slots/keys/other/acquire",
        &[],
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK);

    // a release frees the slot at once; a second release of it is 404 and frees nothing
    let body = format!(r#"{{"lease":"{first}"}}"#);
    let (s, v, _) = post(&r, "release", &body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v, serde_json::json!({"released": true, "lease": first}));
    let (s, v, _) = post(&r, "release", &body).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    assert_eq!(v["error"]["code"], "unknown_lease");
    let (s, third, _) = post(&r, "acquire", "").await;
    assert_eq!((s, third["in_flight"].clone()), (StatusCode::OK, 2.into()));
    let (s, _, _) = post(&r, "acquire", "").await;
    assert_eq!(
        s,
        StatusCode::TOO_MANY_REQUESTS,
        "the double release freed nothing"
    );

    // renew moves the lapse; a released lease cannot be renewed
    let (s, v, _) = post(&r, "renew", &format!(r#"{{"lease":"{second}","ttl":100}}"#)).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["renewed"], true);
    let lapse = v["expires_at"].as_f64().expect("expires_at");
    let (_, d, _) = post(&r, "acquire", "").await;
    let third_lapse = third["expires_at"].as_f64().expect("expires_at");
    assert!(
        (d["retry_after"].as_f64().unwrap() - (third_lapse.min(lapse) - now())).abs() < 1.0,
        "{d}"
    );
    let (s, v, _) = post(&r, "renew", &format!(r#"{{"lease":"{first}"}}"#)).await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, "unknown_lease".into())
    );
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

#[tokio::test]
async fn a_lease_not_released_lapses_after_its_ttl() {
    let r = router().await;
    let (s, a, _) = post(&r, "acquire", r#"{"count":2,"ttl":0.3}"#).await;
    assert_eq!(s, StatusCode::OK, "{a}");
    let (s, _, _) = post(&r, "acquire", "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    let (s, v, _) = post(&r, "acquire", r#"{"count":2}"#).await;
    assert_eq!(s, StatusCode::OK, "both slots free after the lapse: {v}");
    let lease = a["lease"].as_str().unwrap();
    let (s, v, _) = post(&r, "release", &format!(r#"{{"lease":"{lease}"}}"#)).await;
    assert_eq!(
        (s, v["error"]["code"].clone()),
        (StatusCode::NOT_FOUND, "unknown_lease".into())
    );
}

#[tokio::test]
async fn a_retried_acquire_with_its_own_id_takes_its_slots_once() {
    let r = router().await;
    for _ in 0..3 {
        let (s, v, _) = post(&r, "acquire", r#"{"lease":"req-42.a~b_c"}"#).await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(
            (v["lease"].clone(), v["in_flight"].clone()),
            ("req-42.a~b_c".into(), 1.into())
        );
    }
    let (s, v, _) = post(&r, "acquire", "").await;
    assert_eq!((s, v["in_flight"].clone()), (StatusCode::OK, 2.into()));
}

#[tokio::test]
async fn bad_lease_calls_are_refused_and_change_nothing() {
    let r = router().await;
    let long = format!(r#"{{"lease":"{}"}}"#, "a".repeat(129));
    let cases: &[(&str, &str, &str)] = &[
        ("acquire", r#"{"count":0}"#, "count"),
        ("acquire", r#"{"count":3}"#, "count"),
        ("acquire", r#"{"count":-1}"#, ""),
        ("acquire", r#"{"count":1.5}"#, ""),
        ("acquire", r#"{"count":99999999999}"#, ""),
        ("acquire", r#"{"ttl":0}"#, "ttl"),
        ("acquire", r#"{"ttl":-5}"#, "ttl"),
        ("acquire", r#"{"ttl":1e300}"#, "ttl"),
        ("acquire", r#"{"ttl":"10"}"#, ""),
        ("acquire", r#"{"lease":""}"#, "lease"),
        ("acquire", r#"{"lease":"a b"}"#, "lease"),
        ("acquire", r#"{"lease":"ü"}"#, "lease"),
        ("acquire", &long, "lease"),
        ("acquire", r#"{"cost":1}"#, ""),
        ("acquire", r#"[1]"#, ""),
        ("release", "", "lease"),
        ("release", r#"{"lease":"x","ttl":5}"#, "ttl"),
        ("release", r#"{"lease":"a/b"}"#, "lease"),
        ("renew", r#"{"lease":"x","ttl":0}"#, "ttl"),
        ("renew", r#"{"ttl":5}"#, "lease"),
    ];
    for (path, body, names) in cases {
        let (s, v, _) = post(&r, path, body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains(names), "{path} {body}: {message}");
    }
    // a namespace of hits takes no leases; an unknown one is 404
    let (s, v, _) = send(&r, "POST", "/v1/namespaces/login/keys/k/acquire", &[], "").await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("concurrency"),
        "{v}"
    );
    let (s, _, _) = send(&r, "POST", "/v1/namespaces/nope/keys/k/acquire", &[], "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // nothing was taken: both slots are free
    let (s, v, _) = post(&r, "acquire", r#"{"count":2}"#).await;
    assert_eq!(s, StatusCode::OK, "{v}");
}
