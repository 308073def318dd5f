//! Runtime limits over the router, on namespaces without a store (the node keeps them):
//! they replace the config's for their key at once, go back on DELETE, are validated like
//! the file's, and need the `limits` scope to change (`limits` or `admin` to read).

use axum::http::StatusCode;

use super::{call, hit, router, router_with, send, JSON};

const VIP: &str = "/v1/namespaces/login/keys/k/limits";

#[tokio::test]
async fn runtime_limits_replace_the_config_and_go_back_on_delete() {
    let r = router().await;
    let (s, v) = call(&r, "GET", VIP, None, "").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["source"], "config");
    assert_eq!(
        v["limits"],
        serde_json::json!([{"window_size": 60, "limit": 5.0}])
    );
    assert_eq!(v["kept"], "node");
    // the file's per-key override is the config's too
    let (_, v) = call(&r, "GET", "/v1/namespaces/login/keys/vip/limits", None, "").await;
    assert_eq!(v["source"], "config");
    assert_eq!(v["limits"][0]["limit"], 50.0);

    let (s, v) = call(
        &r,
        "PUT",
        VIP,
        JSON,
        r#"{"limits":[{"window_size":60,"limit":2}],"expires_in":3600}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["source"], "override");
    assert_eq!(v["set_by"], "anonymous");
    assert_eq!(
        v["limits"],
        serde_json::json!([{"window_size": 60, "limit": 2.0}])
    );
    let lapse =
        v["expires_at"].as_f64().expect("expires_at") - v["set_at"].as_f64().expect("set_at");
    assert!((lapse - 3600.0).abs() < 1.0, "{v}");
    // decided under it at once: 2 allowed, then denied, the answer saying 2
    let (s1, _, _) = hit(&r, "k", "").await;
    let (s2, _, _) = hit(&r, "k", "").await;
    let (s3, v3, h3) = hit(&r, "k", "").await;
    assert_eq!(
        (s1, s2, s3),
        (
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        )
    );
    assert_eq!(v3["limit"], 2.0, "{v3}");
    assert_eq!(h3[0].as_deref(), Some("\"60s\";q=2;w=60"));
    // other keys keep the config's
    for _ in 0..5 {
        assert_eq!(hit(&r, "other", "").await.0, StatusCode::OK);
    }
    assert_eq!(hit(&r, "other", "").await.0, StatusCode::TOO_MANY_REQUESTS);

    let (s, page) = call(&r, "GET", "/v1/namespaces/login/limits", None, "").await;
    assert_eq!(s, StatusCode::OK, "{page}");
    assert_eq!(page["limits"].as_array().expect("list").len(), 1);
    assert_eq!(page["limits"][0]["key"], "k");
    assert_eq!(page["next"], serde_json::Value::Null);

    let (s, v) = call(&r, "DELETE", VIP, None, "").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["deleted"], true);
    assert_eq!(v["source"], "config");
    let (_, v) = call(&r, "DELETE", VIP, None, "").await;
    assert_eq!(v["deleted"], false, "a second delete finds nothing");
    // the config's 5 again: 2 spent, 3 more allowed
    for _ in 0..3 {
        assert_eq!(hit(&r, "k", "").await.0, StatusCode::OK);
    }
    assert_eq!(hit(&r, "k", "").await.0, StatusCode::TOO_MANY_REQUESTS);
    let (_, page) = call(&r, "GET", "/v1/namespaces/login/limits", None, "").await;
    assert_eq!(page["limits"], serde_json::json!([]));
}

#[tokio::test]
async fn a_gcra_namespace_takes_a_bucket_at_run_time() {
    let r = router().await;
    let path = "/v1/namespaces/orders/keys/acme/limits";
    let (s, v) = call(
        &r,
        "PUT",
        path,
        JSON,
        r#"{"gcra":{"burst":1,"count":1,"period":"1h"}}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["gcra"]["burst"], 1);
    let h = [("x-api-key", "acme")];
    let first = send(&r, "POST", "/v1/namespaces/orders/keys/acme/hit", &h, "").await;
    let second = send(&r, "POST", "/v1/namespaces/orders/keys/acme/hit", &h, "").await;
    assert_eq!(first.0, StatusCode::OK, "{}", first.1);
    assert_eq!(second.0, StatusCode::TOO_MANY_REQUESTS, "a burst of 1");
}

#[tokio::test]
async fn bad_runtime_limits_are_refused_naming_the_field() {
    let r = router().await;
    let cases: &[(&str, &str, &str)] = &[
        (
            VIP,
            r#"{"limits":[{"window_size":30,"limit":2}]}"#,
            "limits[0].window_size",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":0}]}"#,
            "limits[0].limit",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":-1}]}"#,
            "limits[0].limit",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":1e400}]}"#,
            "malformed",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":1},{"window_size":60,"limit":2}]}"#,
            "limits[1].window_size",
        ),
        (VIP, r#"{"limits":[]}"#, "limits"),
        (VIP, r#"{}"#, "limits"),
        (VIP, "", "limits"),
        (
            VIP,
            r#"{"gcra":{"burst":1,"count":1,"period":"1h"}}"#,
            "gcra",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":1}],"expires_in":0}"#,
            "expires_in",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":1}],"expires_in":-5}"#,
            "expires_in",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":1}],"expires_in":1e12}"#,
            "expires_in",
        ),
        (
            VIP,
            r#"{"limits":[{"window_size":60,"limit":1}],"ttl":5}"#,
            "unknown field",
        ),
        (VIP, r#"[1,2]"#, "JSON object"),
        (
            "/v1/namespaces/orders/keys/a/limits",
            r#"{"limits":[{"window_size":60,"limit":1}]}"#,
            "limits",
        ),
        (
            "/v1/namespaces/orders/keys/a/limits",
            r#"{"gcra":{"burst":1,"count":1,"period":"soon"}}"#,
            "gcra.period",
        ),
        (
            "/v1/namespaces/api/keys/a/limits",
            r#"{"limits":[{"window_size":60,"limit":1}]}"#,
            "no limits to decide against",
        ),
    ];
    for (path, body, names) in cases {
        let ctype = (!body.is_empty()).then_some("application/json");
        let (s, v) = call(&r, "PUT", path, ctype, body).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{path} {body}: {v}");
        let message = v["error"]["message"].as_str().expect("message");
        assert!(message.contains(names), "{body}: {message}");
    }
    // nothing of it was kept
    let (_, v) = call(&r, "GET", VIP, None, "").await;
    assert_eq!(v["source"], "config", "{v}");
    let long = "k".repeat(2000);
    let (s, _) = call(
        &r,
        "GET",
        &format!("/v1/namespaces/login/keys/{long}/limits"),
        None,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, v) = call(&r, "GET", "/v1/namespaces/nope/keys/a/limits", None, "").await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{v}");
    for q in [
        "count=0",
        "count=1001",
        "count=abc",
        "count=-1",
        "colour=red",
    ] {
        let (s, v) = call(
            &r,
            "GET",
            &format!("/v1/namespaces/login/limits?{q}"),
            None,
            "",
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
    }
}

#[tokio::test]
async fn lists_go_in_key_order_by_pages() {
    let r = router().await;
    for k in ["c", "a", "b", "d", "e"] {
        let body = r#"{"limits":[{"window_size":60,"limit":9}]}"#;
        let path = format!("/v1/namespaces/login/keys/{k}/limits");
        assert_eq!(call(&r, "PUT", &path, JSON, body).await.0, StatusCode::OK);
    }
    let mut seen = Vec::new();
    let mut uri = "/v1/namespaces/login/limits?count=2".to_owned();
    loop {
        let (s, page) = call(&r, "GET", &uri, None, "").await;
        assert_eq!(s, StatusCode::OK, "{page}");
        for item in page["limits"].as_array().expect("limits") {
            seen.push(item["key"].as_str().expect("key").to_owned());
        }
        match page["next"].as_str() {
            Some(next) => uri = format!("/v1/namespaces/login/limits?count=2&after={next}"),
            None => break,
        }
    }
    assert_eq!(seen, ["a", "b", "c", "d", "e"]);
}

#[tokio::test]
async fn changing_limits_needs_the_limits_scope_and_reading_admin_or_limits() {
    let token = |name: &str, secret: &str, scopes: &str| {
        format!(
            "[[auth.tokens]]\nname = \"{name}\"\nsha256 = \"{}\"\nscopes = {scopes}\n",
            swin_node::http::hash_token(secret.as_bytes())
        )
    };
    let auth = token("ops", "ops-secret", r#"["admin"]"#)
        + &token("tenants", "t-secret", r#"["limits"]"#)
        + &token("app", "app-secret", r#"["decide"]"#);
    let r = router_with(&auth).await;
    let body = r#"{"limits":[{"window_size":60,"limit":1}]}"#;
    let as_ = |who: &'static str| [("authorization", who)];
    let put = |who: &'static str| {
        let r = r.clone();
        async move { send(&r, "PUT", VIP, &as_(who), body).await }
    };
    assert_eq!(put("Bearer ops-secret").await.0, StatusCode::FORBIDDEN);
    assert_eq!(put("Bearer app-secret").await.0, StatusCode::FORBIDDEN);
    let (s, v, _) = send(&r, "PUT", VIP, &[], body).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "{v}");
    let (s, v, _) = put("Bearer t-secret").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["set_by"], "tenants", "who set it is the token's name");
    for (who, want) in [
        ("Bearer ops-secret", StatusCode::OK),
        ("Bearer t-secret", StatusCode::OK),
        ("Bearer app-secret", StatusCode::FORBIDDEN),
    ] {
        let (s, v, _) = send(&r, "GET", VIP, &[("authorization", who)], "").await;
        assert_eq!(s, want, "{who}: {v}");
        let (s, _, _) = send(
            &r,
            "GET",
            "/v1/namespaces/login/limits",
            &[("authorization", who)],
            "",
        )
        .await;
        assert_eq!(s, want, "{who} lists");
    }
    let (s, v, _) = send(
        &r,
        "DELETE",
        VIP,
        &[("authorization", "Bearer ops-secret")],
        "",
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN, "{v}");
    let (s, v, _) = send(
        &r,
        "DELETE",
        VIP,
        &[("authorization", "Bearer t-secret")],
        "",
    )
    .await;
    assert_eq!(
        (s, &v["deleted"]),
        (StatusCode::OK, &serde_json::json!(true)),
        "{v}"
    );
}

/// Who is limited: the heaviest keys of the last minute by hits denied and by hits,
/// exact while the keys fit the sketch; decisions counted by the rule that decided.
#[tokio::test]
async fn the_heaviest_keys_and_the_rules_that_decided() {
    let r = router().await;
    // login allows 5 a minute; vip 50 (the file's override)
    for (key, n) in [("mallory", 9), ("eve", 7), ("alice", 2), ("vip", 6)] {
        for _ in 0..n {
            hit(&r, key, "").await;
        }
    }
    let (s, v) = call(&r, "GET", "/v1/namespaces/login/top", None, "").await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["by"], "denied");
    assert_eq!(v["window_secs"], 60);
    let keys: Vec<(String, f64, f64)> = v["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .map(|k| {
            (
                k["key"].as_str().expect("key").to_owned(),
                k["count"].as_f64().expect("count"),
                k["error"].as_f64().expect("error"),
            )
        })
        .collect();
    assert_eq!(
        keys,
        vec![("mallory".into(), 4.0, 0.0), ("eve".into(), 2.0, 0.0)],
        "{v}"
    );
    assert_eq!(v["total"], 6.0);
    assert_eq!(v["error_bound"], 0.0);
    let (_, v) = call(
        &r,
        "GET",
        "/v1/namespaces/login/top?by=hits&count=2",
        None,
        "",
    )
    .await;
    assert_eq!(v["keys"][0]["key"], "mallory");
    assert_eq!(v["keys"][0]["count"], 9.0);
    assert_eq!(v["keys"][1]["key"], "eve");
    assert_eq!(v["keys"].as_array().expect("keys").len(), 2);
    assert_eq!(v["total"], 24.0);
    // dry runs decide nothing
    send(
        &r,
        "POST",
        "/v1/namespaces/login/keys/quiet/hit",
        &[],
        r#"{"dry_run":true}"#,
    )
    .await;
    let (_, v) = call(
        &r,
        "GET",
        "/v1/namespaces/login/top?by=hits&count=100",
        None,
        "",
    )
    .await;
    assert!(v["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .all(|k| k["key"] != "quiet"));
    for q in [
        "by=allowed",
        "count=0",
        "count=101",
        "count=x",
        "colour=red",
    ] {
        let (s, v) = call(
            &r,
            "GET",
            &format!("/v1/namespaces/login/top?{q}"),
            None,
            "",
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{q}: {v}");
    }
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("metrics");
    // 24 hits, 6 denied, and the dry run (a decision, counted nowhere)
    for line in [
        "swin_decisions_total{namespace=\"login\",rule=\"60s\",decision=\"allowed\"} 19",
        "swin_decisions_total{namespace=\"login\",rule=\"60s\",decision=\"denied\"} 6",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// A concurrency namespace limits requests in flight, by its `limit` or its descriptor
/// rules: runtime limits of hits are refused there, saying so, and change nothing.
#[tokio::test]
async fn a_concurrency_namespace_takes_no_runtime_limits() {
    let r = router().await;
    let (s, v) = call(
        &r,
        "PUT",
        "/v1/namespaces/slots/keys/k/limits",
        JSON,
        r#"{"limits":[{"window_size":60,"limit":2}]}"#,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(message.contains("in flight"), "{message}");
}

#[tokio::test]
async fn a_runtime_limit_in_shadow_lets_hits_through_and_says_so() {
    let r = router().await;
    let (s, v) = call(
        &r,
        "PUT",
        VIP,
        JSON,
        r#"{"limits":[{"window_size":60,"limit":1,"shadow":true}]}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(
        v["limits"],
        serde_json::json!([{"window_size": 60, "limit": 1.0, "shadow": true}])
    );
    let (s1, v1, _) = hit(&r, "k", "").await;
    let (s2, v2, _) = hit(&r, "k", "").await;
    assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{v2}");
    assert!(v1.get("shadow_denied").is_none(), "{v1}");
    assert_eq!(
        (&v2["shadow_denied"], &v2["remaining"]),
        (&true.into(), &0.0.into())
    );
}
