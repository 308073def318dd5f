//! Operating a node: metrics, health and readiness, tokens and scopes, size limits, and
//! the API description.

use super::*;

/// The exposition passes Prometheus' own linter (`promtool check metrics`: help and type
/// for every family, counter suffixes, histogram lines), before any request and after
/// traffic of every kind.
#[tokio::test]
async fn metrics_pass_promtool() {
    let r = router().await;
    let lint = |text: String| {
        use std::io::Write;
        // scripts/test sets SWIN_PROMTOOL, or leaves the one it unpacked under target/tools
        let unpacked = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/tools/prometheus/usr/bin/promtool"
        );
        let promtool = std::env::var("SWIN_PROMTOOL").unwrap_or_else(|_| {
            if std::path::Path::new(unpacked).exists() {
                unpacked.into()
            } else {
                "promtool".into()
            }
        });
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {promtool} (scripts/test provides it): {e}"));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(text.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (s, v) = call(&r, "GET", "/metrics", None, "").await;
    assert_eq!(s, StatusCode::OK);
    lint(v.as_str().expect("text").to_owned());
    call(&r, "POST", "/v1/namespaces/api/keys/k/increment", None, "").await;
    call(
        &r,
        "POST",
        "/v1/namespaces/no%22such/keys/k/increment",
        None,
        "",
    )
    .await;
    for _ in 0..4 {
        send(&r, "POST", "/v1/namespaces/orders/keys/m/hit", &[], "").await;
    }
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text").to_owned();
    assert!(text.contains("swin_sync_duration_seconds_bucket"), "{text}");
    assert!(text.contains("swin_decisions_total{"), "{text}");
    lint(text);
}

#[tokio::test]
async fn health_ready_namespaces_and_metrics() {
    let r = router().await;
    call(&r, "POST", "/v1/namespaces/api/keys/k/increment", None, "").await;
    assert_eq!(
        call(&r, "GET", "/healthz", None, "").await.0,
        StatusCode::OK
    );
    assert_eq!(call(&r, "GET", "/readyz", None, "").await.0, StatusCode::OK);
    let (s, v) = call(&r, "GET", "/v1/namespaces", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["namespaces"][0]["sync_mode"], "local");
    assert_eq!(
        v["namespaces"][0]["window_sizes"],
        serde_json::json!([1, 60])
    );
    let (s, v) = call(&r, "GET", "/metrics", None, "").await;
    assert_eq!(s, StatusCode::OK);
    let text = v.as_str().expect("text");
    assert!(
        text.contains("swin_increments_total{namespace=\"api\"} 1"),
        "{text}"
    );
    assert!(text.contains("swin_http_requests_total{route=\"/v1/namespaces/{namespace}/keys/{key}/increment\",status=\"200\"} 1"), "{text}");
    assert!(
        text.contains("swin_counters{namespace=\"api\"} 2"),
        "{text}"
    );
    // decisions and buckets
    for _ in 0..4 {
        send(&r, "POST", "/v1/namespaces/orders/keys/m/hit", &[], "").await;
    }
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text");
    for line in [
        "swin_decisions_total{namespace=\"orders\",rule=\"gcra\",decision=\"allowed\"} 3",
        "swin_decisions_total{namespace=\"orders\",rule=\"gcra\",decision=\"denied\"} 1",
        "swin_buckets{namespace=\"orders\"} 1",
        "swin_rejected_windows_total{namespace=\"orders\"} 0",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    let (_, v) = call(&r, "GET", "/v1/namespaces", None, "").await;
    let algorithms: Vec<_> = v["namespaces"]
        .as_array()
        .expect("list")
        .iter()
        .map(|n| (n["name"].clone(), n["algorithm"].clone()))
        .collect();
    assert_eq!(
        algorithms,
        vec![
            ("api".into(), serde_json::Value::Null),
            ("login".into(), "sliding_window".into()),
            ("orders".into(), "gcra".into()),
            ("signed".into(), serde_json::Value::Null),
            ("slots".into(), "concurrency".into()),
            ("tiny".into(), serde_json::Value::Null),
        ]
    );
    let slots = &v["namespaces"][4];
    assert_eq!(
        (slots["limit"].clone(), slots["lease_ttl"].clone()),
        (2.into(), 30.0.into())
    );
    // lease calls are counted by outcome
    let key = "/v1/namespaces/slots/keys/m";
    let (_, a, _) = send(&r, "POST", &format!("{key}/acquire"), &[], r#"{"count":2}"#).await;
    send(&r, "POST", &format!("{key}/acquire"), &[], "").await;
    let release = format!(r#"{{"lease":"{}"}}"#, a["lease"].as_str().expect("lease"));
    send(&r, "POST", &format!("{key}/release"), &[], &release).await;
    send(&r, "POST", &format!("{key}/release"), &[], &release).await;
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text");
    for outcome in ["acquired", "denied", "released", "not_live"] {
        let line =
            format!("swin_lease_operations_total{{namespace=\"slots\",outcome=\"{outcome}\"}} 1");
        assert!(text.contains(&line), "{line} in {text}");
    }
    // reservations too, and their costs by part
    let key = "/v1/namespaces/login/keys/m";
    let (_, a, _) = send(&r, "POST", &format!("{key}/reserve"), &[], r#"{"cost":4}"#).await;
    send(&r, "POST", &format!("{key}/reserve"), &[], r#"{"cost":2}"#).await;
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text");
    let open = "swin_reservations_open{namespace=\"login\"} 1\n";
    assert!(text.contains(open), "{open} in {text}");
    let commit = format!(
        r#"{{"reservation":"{}","cost":1.5}}"#,
        a["reservation"].as_str().expect("reservation")
    );
    send(&r, "POST", &format!("{key}/commit"), &[], &commit).await;
    send(&r, "POST", &format!("{key}/commit"), &[], &commit).await;
    let (_, v) = call(&r, "GET", "/metrics", None, "").await;
    let text = v.as_str().expect("text");
    for line in [
        "swin_reservation_operations_total{namespace=\"login\",outcome=\"reserved\"} 1",
        "swin_reservation_operations_total{namespace=\"login\",outcome=\"denied\"} 1",
        "swin_reservation_operations_total{namespace=\"login\",outcome=\"committed\"} 1",
        "swin_reservation_operations_total{namespace=\"login\",outcome=\"replayed\"} 1",
        "swin_reservation_cost_total{namespace=\"login\",part=\"reserved\"} 4",
        "swin_reservation_cost_total{namespace=\"login\",part=\"given_back\"} 2.5",
        "swin_reservations_open{namespace=\"login\"} 0\n",
        "swin_leases_in_flight{namespace=\"slots\"} 0\n",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
}

/// With `[auth]`, each route needs its scope: no token or an unknown one is 401 with
/// `WWW-Authenticate: Bearer`, a token without the scope is 403, and neither counts
/// anything; health and readiness stay open. (Tables of calls and what each answers:
/// long because the tables are.)
/// Every method on every route that needs a token, sent without one: 401 where the
/// route serves the method (HEAD as its GET; a `*` route the standard methods), 405
/// where it does not — never an answer from the handler, and never a 401 for a method
/// no handler serves.
#[tokio::test]
async fn every_method_of_every_guarded_route_needs_a_token_or_is_405() {
    let r = router_with(&auth_section()).await;
    let open = ["/healthz", "/readyz", "/v1/openapi.json"];
    let table = http::routes();
    let standard = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"];
    let methods = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PURGE",
    ];
    for (_, path) in table.iter().filter(|(_, p)| !open.contains(p)) {
        let uri = path
            .replace("{namespace}", "api")
            .replace("{key}", "k")
            .replace("{id}", "r1");
        for method in methods {
            let asked = if method == "HEAD" { "GET" } else { method };
            let served = table.iter().any(|(m, p)| {
                p == path && (*m == asked || (*m == "*" && standard.contains(&asked)))
            });
            let (status, code, _) = authed(&r, method, &uri, None).await;
            let want = if served {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::METHOD_NOT_ALLOWED
            };
            assert_eq!(status, want, "{method} {uri} ({path}): {code}");
        }
    }
}

#[tokio::test]
async fn tokens_and_scopes() {
    let r = router_with(&auth_section()).await;
    let inc = "/v1/namespaces/api/keys/k/increment";
    let app = Some("Bearer app-secret");
    let ops = Some("Bearer ops-secret");
    let prom = Some("Bearer prom-secret");
    let unauthorized = (
        StatusCode::UNAUTHORIZED,
        "unauthorized".to_owned(),
        Some("Bearer".to_owned()),
    );
    for bad in [
        None,
        Some("Bearer wrong-secret"),
        Some("Basic YXBwOmFwcC1zZWNyZXQ="),
        Some("Bearer"),
        Some("Bearer "),
        Some("app-secret"),
    ] {
        assert_eq!(authed(&r, "POST", inc, bad).await, unauthorized, "{bad:?}");
    }
    let forbidden = (StatusCode::FORBIDDEN, "forbidden".to_owned(), None);
    for (method, uri, token) in [
        ("POST", inc, ops),
        ("POST", inc, prom),
        ("GET", "/v1/namespaces/api/keys/k", ops),
        ("POST", "/v1/namespaces/login/keys/a/hit", ops),
        ("POST", "/v1/namespaces/slots/keys/a/acquire", ops),
        ("POST", "/v1/namespaces/slots/keys/a/release", prom),
        ("POST", "/v1/namespaces/slots/keys/a/renew", ops),
        ("POST", "/v1/namespaces/login/keys/a/reserve", ops),
        ("POST", "/v1/namespaces/login/keys/a/commit", prom),
        ("DELETE", "/v1/namespaces/api/keys/k", app),
        ("GET", "/v1/namespaces", app),
        ("POST", "/v1/namespaces/api/sync", prom),
        ("GET", "/metrics", app),
    ] {
        assert_eq!(
            authed(&r, method, uri, token).await,
            forbidden,
            "{method} {uri} {token:?}"
        );
    }
    // the scheme in any case; what the scopes allow
    for (method, uri, token) in [
        ("POST", inc, app),
        ("POST", inc, Some("bearer app-secret")),
        ("POST", "/v1/namespaces/login/keys/a/hit", app),
        ("POST", "/v1/namespaces/slots/keys/a/acquire", app),
        ("GET", "/v1/namespaces/api/keys/k", app),
        ("GET", "/v1/namespaces", ops),
        ("GET", "/metrics", prom),
        ("GET", "/healthz", None),
        ("GET", "/readyz", None),
    ] {
        let (status, code, _) = authed(&r, method, uri, token).await;
        assert_eq!(status, StatusCode::OK, "{method} {uri} {token:?}: {code}");
    }
    // a HEAD is its GET route's, token and all; a method no route serves on a path is
    // 405 and a path none serves 404, with or without a token (no route: no scope)
    assert_eq!(
        authed(&r, "HEAD", "/metrics", None).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(authed(&r, "HEAD", "/metrics", prom).await.0, StatusCode::OK);
    assert_eq!(
        authed(&r, "HEAD", "/metrics", app).await.0,
        StatusCode::FORBIDDEN
    );
    for token in [None, app] {
        let (status, code, _) = authed(&r, "PATCH", inc, token).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{token:?}: {code}");
        let (status, code, _) = authed(&r, "POST", "/v1/nowhere", token).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{token:?}: {code}");
    }
    // only the two allowed increments counted
    let (_, v) = {
        let req = Request::builder()
            .uri("/v1/namespaces/api/keys/k")
            .header("authorization", "Bearer app-secret")
            .body(Body::empty())
            .expect("request");
        let resp = r.clone().oneshot(req).await.expect("response");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (
            (),
            serde_json::from_slice::<serde_json::Value>(&bytes).expect("json"),
        )
    };
    // (in the 60 s window, whole across its boundary: the 1 s one may have moved on
    // since the increments on a loaded machine)
    let w = &v["windows"][1];
    assert_eq!(w["window_size"], 60, "{v}");
    assert_eq!(
        w["current"].as_f64().expect("current") + w["previous"].as_f64().expect("previous"),
        2.0,
        "{v}"
    );
    // an admin reset is allowed for ops
    let (status, _, _) = authed(&r, "DELETE", "/v1/namespaces/api/keys/k", ops).await;
    assert!(status.is_success(), "{status}");
    // metrics name tokens, never secrets
    let (_, text) = {
        let req = Request::builder()
            .uri("/metrics")
            .header("authorization", "Bearer prom-secret")
            .body(Body::empty())
            .expect("request");
        let resp = r.clone().oneshot(req).await.expect("response");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        ((), String::from_utf8(bytes.to_vec()).expect("utf8"))
    };
    for line in [
        "swin_auth_requests_total{token=\"app\",outcome=\"allowed\"}",
        "swin_auth_requests_total{token=\"ops\",outcome=\"forbidden\"}",
        "swin_auth_requests_total{token=\"\",outcome=\"missing\"}",
        "swin_auth_requests_total{token=\"\",outcome=\"unknown\"}",
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }
    assert!(!text.contains("secret"), "{text}");
}

/// A declared `Content-Length` over `body_limit` is refused before a byte is read, and a
/// batch holds at most `max_batch` items (50 here) on both batch routes.
#[tokio::test]
async fn declared_lengths_and_batch_sizes_are_bounded() {
    let r = router().await;
    let req = Request::builder()
        .method("POST")
        .uri("/v1/increments")
        .header("content-type", "application/json")
        .header("content-length", "1000000000")
        .body(Body::empty())
        .expect("request");
    let resp = r.clone().oneshot(req).await.expect("response");
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let items = |n: usize, what: &str| {
        let one = r#"{"namespace":"api","key":"b"}"#;
        format!("{{\"{what}\":[{}]}}", vec![one; n].join(","))
    };
    for (uri, what) in [("/v1/increments", "increments"), ("/v1/hits", "hits")] {
        let (s, v) = call(&r, "POST", uri, JSON, &items(51, what)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{uri}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("max_batch")),
            "{v}"
        );
    }
    let (s, v) = call(&r, "POST", "/v1/increments", JSON, &items(50, "increments")).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    // the minute's window, this one and the one before: a second's window may have
    // turned between the batch and the read on a loaded machine
    let (_, v) = call(
        &r,
        "GET",
        "/v1/namespaces/api/keys/b?window_size=60",
        None,
        "",
    )
    .await;
    let w = &v["windows"][0];
    assert_eq!(
        w["current"].as_f64().expect("current") + w["previous"].as_f64().expect("previous"),
        50.0,
        "only the batch within max_batch counted: {v}"
    );
}

/// A URI or headers past the limits: 414 and 431, each with a JSON error.
#[tokio::test]
async fn long_uris_and_large_headers_get_json_errors() {
    let r = router().await;
    let long_key = "k".repeat(9 * 1024);
    let uri = format!("/v1/namespaces/api/keys/{long_key}");
    let (s, v) = call(&r, "GET", &uri, None, "").await;
    assert_eq!(s, StatusCode::URI_TOO_LONG);
    assert_eq!(v["error"]["code"], "uri_too_long");
    let big = "x".repeat(17 * 1024);
    let (s, v, _) = send(&r, "GET", "/healthz", &[("x-big", big.as_str())], "").await;
    assert_eq!(s, StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    assert_eq!(v["error"]["code"], "headers_too_large");
}

/// `/v1/openapi.json` describes every route the router has, and nothing it lacks; every
/// route it lists is routed (not the 404 or 405 of an unknown route or method).
#[tokio::test]
async fn the_description_covers_every_route() {
    let r = router().await;
    let (s, doc) = call(&r, "GET", "/v1/openapi.json", None, "").await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().expect("paths");
    let routes = http::routes();
    for (method, path) in &routes {
        let ops = paths
            .get(*path)
            .unwrap_or_else(|| panic!("{path} is not described"));
        let methods: Vec<&str> = if *method == "*" {
            vec!["get", "post", "put", "delete", "patch"]
        } else {
            vec![method]
        };
        for m in methods {
            assert!(
                ops.get(m.to_ascii_lowercase()).is_some(),
                "{m} {path} is not described"
            );
            let uri = path.replace("{namespace}", "api").replace("{key}", "k");
            let (s, v) = call(&r, &m.to_ascii_uppercase(), &uri, None, "").await;
            assert_ne!(s, StatusCode::METHOD_NOT_ALLOWED, "{m} {uri}");
            assert_ne!(v["error"]["code"], "not_found", "{m} {uri}: {v}");
        }
    }
    for (path, ops) in paths {
        for m in ops.as_object().expect("operations").keys() {
            let listed = routes
                .iter()
                .any(|(rm, rp)| rp == path && (*rm == "*" || rm.eq_ignore_ascii_case(m)));
            assert!(listed, "{m} {path} is described but not routed");
        }
    }
}

/// The status page takes the token as a bearer or as a Basic password (what a browser's
/// login prompt sends), and asks a browser for it; whatever else an Authorization header
/// holds is refused as unknown, never an error.
#[tokio::test]
async fn the_status_page_takes_the_token_as_a_basic_password() {
    use base64::Engine;
    let r = router_with(&auth_section()).await;
    let basic = |s: &[u8]| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(s)
        )
    };
    for uri in ["/ui", "/ui/status"] {
        for bad in [
            None,
            Some("Basic".to_owned()),
            Some("Basic ".to_owned()),
            Some("Basic !!!not base64".to_owned()),
            Some(basic(b"no colon ops-secret")),
            Some(basic(b"ops:\xff\xfe")),
            Some(basic(b"ops:wrong")),
            Some(basic(b"ops-secret:")),
            Some(format!("Basic {}", "A".repeat(6000))),
        ] {
            let (status, code, _) = authed(&r, "GET", uri, bad.as_deref()).await;
            assert_eq!(
                (status, code.as_str()),
                (StatusCode::UNAUTHORIZED, "unauthorized"),
                "{uri} {bad:?}"
            );
        }
        let req = Request::builder()
            .uri(uri)
            .body(Body::empty())
            .expect("request");
        let resp = r.clone().oneshot(req).await.expect("response");
        let challenges: Vec<&str> = resp
            .headers()
            .get_all("www-authenticate")
            .iter()
            .map(|v| v.to_str().expect("ascii"))
            .collect();
        assert_eq!(
            challenges,
            ["Bearer", "Basic realm=\"swin\", charset=\"UTF-8\""]
        );
        for (auth, status) in [
            (basic(b"anyone:ops-secret"), StatusCode::OK),
            (basic(b":ops-secret"), StatusCode::OK),
            ("bAsIc b3BzOm9wcy1zZWNyZXQ=".to_owned(), StatusCode::OK),
            ("Bearer ops-secret".to_owned(), StatusCode::OK),
            (basic(b"app:app-secret"), StatusCode::FORBIDDEN),
        ] {
            assert_eq!(
                authed(&r, "GET", uri, Some(&auth)).await.0,
                status,
                "{uri} {auth}"
            );
        }
    }
    // Basic credentials are the status page's only
    let (status, _, challenge) =
        authed(&r, "GET", "/v1/namespaces", Some(&basic(b"ops:ops-secret"))).await;
    assert_eq!(
        (status, challenge.as_deref()),
        (StatusCode::UNAUTHORIZED, Some("Bearer"))
    );
}
