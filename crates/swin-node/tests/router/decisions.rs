//! Decisions: hits up to a limit, refunds, dry runs and costs, GCRA buckets, batches
//! decided all or nothing, resets, and forward auth.

use super::*;

#[tokio::test]
async fn hits_are_allowed_up_to_the_limit_then_429_with_headers() {
    let r = router().await;
    for i in 0..5 {
        let (s, v, h) = hit(&r, "alice", "").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["allowed"], true);
        assert_eq!(v["limit"], 5.0);
        assert_eq!(v["remaining"], f64::from(4 - i));
        assert_eq!(h[0].as_deref(), Some("\"60s\";q=5;w=60"));
        assert!(
            h[1].as_deref()
                .is_some_and(|x| x.starts_with(&format!("\"60s\";r={};t=", 4 - i))),
            "{h:?}"
        );
        assert_eq!(h[2], None);
    }
    let (s, v, h) = hit(&r, "alice", "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["allowed"], false);
    let retry: u64 = h[2]
        .as_deref()
        .expect("Retry-After")
        .parse()
        .expect("whole seconds");
    assert!(retry >= 1 && (retry as f64) >= v["retry_after"].as_f64().expect("retry_after"));
    let t: u64 = h[1]
        .as_deref()
        .expect("RateLimit")
        .rsplit("t=")
        .next()
        .expect("t")
        .parse()
        .expect("t");
    assert!(retry >= t, "Retry-After {retry} earlier than t {t}");
    // denied hits are not counted; another key has its own budget; vip has fifty
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/alice", None, "").await;
    assert_eq!(v["windows"][0]["current"], 5.0);
    assert_eq!(hit(&r, "bob", "").await.0, StatusCode::OK);
    for _ in 0..10 {
        assert_eq!(hit(&r, "vip", "").await.0, StatusCode::OK);
    }
}

#[tokio::test]
async fn refunds_give_back_admitted_hits() {
    let r = router().await;
    for _ in 0..5 {
        assert_eq!(hit(&r, "dave", "").await.0, StatusCode::OK);
    }
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/dave/refund",
        JSON,
        r#"{"cost": 2}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        (v["allowed"].clone(), v["remaining"].clone()),
        (serde_json::json!(true), serde_json::json!(2.0))
    );
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::OK);
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::OK);
    assert_eq!(hit(&r, "dave", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    // nothing counted, nothing to give back; never below zero
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/erin/refund",
        None,
        "",
    )
    .await;
    assert_eq!(
        (s, v["allowed"].clone()),
        (StatusCode::OK, serde_json::json!(false))
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/erin", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
    let (s, _) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/erin/refund",
        JSON,
        r#"{"cost": -1}"#,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn dry_runs_and_costs() {
    let r = router().await;
    let (s, v, _) = hit(&r, "carol", r#"{"cost": 3}"#).await;
    assert_eq!(
        (s, v["remaining"].clone()),
        (StatusCode::OK, serde_json::json!(2.0))
    );
    let (s, v, _) = hit(&r, "carol", r#"{"cost": 3, "dry_run": true}"#).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(v["remaining"], 2.0);
    let (s, v, _) = hit(&r, "carol", r#"{"cost": 2, "dry_run": true}"#).await;
    assert_eq!(
        (s, v["remaining"].clone()),
        (StatusCode::OK, serde_json::json!(0.0))
    );
    let (s, _, _) = hit(&r, "carol", r#"{"cost": 2}"#).await;
    assert_eq!(s, StatusCode::OK, "the dry runs counted nothing");
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/login/keys/carol/hit",
        JSON,
        r#"{"cost": 6}"#,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/carol", None, "").await;
    assert_eq!(
        v["windows"][0]["current"], 5.0,
        "a refused cost counts nothing"
    );
    let (s, v) = call(&r, "POST", "/v1/namespaces/api/keys/k/hit", None, "").await;
    assert_eq!(
        s,
        StatusCode::BAD_REQUEST,
        "a namespace without limits: {v}"
    );
}

#[tokio::test]
async fn gcra_buckets_spend_refund_and_say_when() {
    let r = router().await;
    let orders = |key: &str| format!("/v1/namespaces/orders/keys/{key}/hit");
    for i in 0..3 {
        let (s, v, h) = send(&r, "POST", &orders("o1"), &[], "").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert_eq!(v["limit"], 3.0);
        assert_eq!(v["remaining"], f64::from(2 - i));
        assert_eq!(h[0].as_deref(), Some("\"gcra\";q=3;w=60"));
    }
    let (s, v, h) = send(&r, "POST", &orders("o1"), &[], "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    let retry = v["retry_after"].as_f64().expect("retry_after");
    assert!(retry > 19.0 && retry <= 20.0, "{v}");
    assert_eq!(h[2].as_deref(), Some("20"));
    assert_eq!(v["reset_after"].as_f64().map(f64::round), Some(60.0));
    // a dry run spends nothing; a refund gives one token back
    let (s, _, _) = send(&r, "POST", &orders("o1"), &[], r#"{"dry_run": true}"#).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    let (s, v) = call(&r, "POST", "/v1/namespaces/orders/keys/o1/refund", None, "").await;
    assert_eq!(
        (s, v["allowed"].clone()),
        (StatusCode::OK, serde_json::json!(true))
    );
    assert_eq!(
        send(&r, "POST", &orders("o1"), &[], "").await.0,
        StatusCode::OK
    );
    // costs are whole tokens, at most the burst
    for bad in [r#"{"cost": 1.5}"#, r#"{"cost": 4}"#, r#"{"cost": -1}"#] {
        let (s, v, _) = send(&r, "POST", &orders("o2"), &[], bad).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
}

#[tokio::test]
async fn batch_decisions_are_all_or_nothing() {
    let r = router().await;
    let both = r#"{"hits": [{"namespace": "login", "key": "b1"},
                            {"namespace": "orders", "key": "b1", "cost": 2}]}"#;
    let (s, v, h) = send(&r, "POST", "/v1/hits", &[], both).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["spent"], true);
    assert_eq!(v["results"][1]["namespace"], "orders");
    assert_eq!(v["results"][1]["remaining"], 1.0);
    // the strictest (orders, 1 left) is the answer at the top
    assert_eq!(v["remaining"], 1.0);
    assert_eq!(
        h[0].as_deref(),
        Some("\"login.60s\";q=5;w=60, \"orders.gcra\";q=3;w=60")
    );
    assert!(
        h[1].as_deref()
            .is_some_and(|x| x.starts_with("\"orders.gcra\";r=1;")),
        "{h:?}"
    );
    // orders has 1 token left: a batch wanting 2 is denied and login is not counted
    let (s, v, h) = send(&r, "POST", "/v1/hits", &[], both).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(
        (v["spent"].clone(), v["allowed"].clone()),
        (false.into(), false.into())
    );
    assert_eq!(v["results"][0]["allowed"], true);
    // login's hit was given back: it answers what it had before (5 - 1), not 3
    assert_eq!(v["results"][0]["remaining"], 4.0, "{v}");
    assert!(h[2].is_some());
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/b1", None, "").await;
    assert_eq!(v["windows"][0]["current"], 1.0, "given back");
    let one = r#"{"hits": [{"namespace": "orders", "key": "b1"}]}"#;
    assert_eq!(
        send(&r, "POST", "/v1/hits", &[], one).await.0,
        StatusCode::OK
    );
    // bad batches name the hit; nothing of them stays counted
    let bad =
        r#"{"hits": [{"namespace": "login", "key": "b2"}, {"namespace": "api", "key": "x"}]}"#;
    let (s, v, _) = send(&r, "POST", "/v1/hits", &[], bad).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("hits[1]")),
        "{v}"
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/b2", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
    for body in [r#"{"hits": []}"#, "", r#"{"hits": [{"key": "k"}]}"#] {
        let (s, _) = call(&r, "POST", "/v1/hits", JSON, body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}");
    }
}

#[tokio::test]
async fn delete_resets_a_key() {
    let r = router().await;
    for _ in 0..5 {
        hit(&r, "zed", "").await;
    }
    assert_eq!(hit(&r, "zed", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    let (s, v) = call(&r, "DELETE", "/v1/namespaces/login/keys/zed", None, "").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v,
        serde_json::json!({"namespace": "login", "key": "zed", "reset": true})
    );
    assert_eq!(hit(&r, "zed", "").await.0, StatusCode::OK);
    let (s, _) = call(&r, "DELETE", "/v1/namespaces/nope/keys/zed", None, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn forward_auth_takes_the_key_from_a_header_or_the_client_address() {
    let r = router().await;
    let key = [("x-api-key", "team-a")];
    for _ in 0..3 {
        let (s, v, h) = send(&r, "GET", "/v1/auth/orders", &key, "").await;
        assert_eq!(s, StatusCode::OK, "{v}");
        assert!(h[1].is_some());
    }
    let (s, _, h) = send(&r, "GET", "/v1/auth/orders", &key, "").await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    assert!(h[2].is_some(), "Retry-After on a denial");
    let (s, _, _) = send(&r, "POST", "/v1/auth/orders?deny_status=403", &key, "").await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let other = [("x-api-key", "team-b")];
    assert_eq!(
        send(&r, "GET", "/v1/auth/orders", &other, "").await.0,
        StatusCode::OK
    );
    let (s, v, _) = send(&r, "GET", "/v1/auth/orders", &[], "").await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    // login limits by client address: behind the trusted proxy, the right-most
    // X-Forwarded-For entry that is not a trusted proxy, else X-Real-IP
    let fwd = [("x-forwarded-for", "203.0.113.7, 127.0.0.1")];
    for _ in 0..5 {
        assert_eq!(
            send(&r, "GET", "/v1/auth/login", &fwd, "").await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        send(
            &r,
            "GET",
            "/v1/auth/login",
            &[("x-real-ip", "203.0.113.7")],
            ""
        )
        .await
        .0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/203.0.113.7", None, "").await;
    assert_eq!(v["windows"][0]["current"], 5.0);
    // from a peer that is not a trusted proxy the headers are not believed: the peer is
    // the key, whatever it claims
    let forged = [
        ("x-forwarded-for", "203.0.113.99"),
        ("x-real-ip", "203.0.113.98"),
    ];
    for _ in 0..2 {
        let (s, _, _) = send_from(
            &r,
            "198.51.100.4:5555",
            "GET",
            "/v1/auth/login",
            &forged,
            "",
        )
        .await;
        assert_eq!(s, StatusCode::OK);
    }
    for key in ["203.0.113.99", "203.0.113.98"] {
        let uri = format!("/v1/namespaces/login/keys/{key}");
        let (_, v) = call(&r, "GET", &uri, None, "").await;
        assert_eq!(v["windows"][0]["current"], 0.0, "{key}");
    }
    let (_, v) = call(
        &r,
        "GET",
        "/v1/namespaces/login/keys/198.51.100.4",
        None,
        "",
    )
    .await;
    assert_eq!(v["windows"][0]["current"], 2.0);
    // a trusted proxy passing something that is not an address: no key, nothing counted
    let (s, v, _) = send(
        &r,
        "GET",
        "/v1/auth/login",
        &[("x-forwarded-for", "alice")],
        "",
    )
    .await;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("no_key"))
    );
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/alice", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
    for bad in [
        "/v1/auth/login?deny_status=500",
        "/v1/auth/login?cost=x",
        "/v1/auth/api",
    ] {
        let (s, _, _) = send(&r, "GET", bad, &fwd, "").await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(
        send(&r, "GET", "/v1/auth/nope", &fwd, "").await.0,
        StatusCode::NOT_FOUND
    );
}
