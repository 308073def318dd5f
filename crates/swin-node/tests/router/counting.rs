//! Counting: increments and reads, keys and values as a client may send them, and
//! every bad input beside its status and error code.

use super::*;

/// method, uri, content type, body, expected status, expected error code
type Case<'a> = (
    &'a str,
    String,
    Option<&'a str>,
    &'a str,
    StatusCode,
    &'a str,
);

#[tokio::test]
async fn increment_with_an_empty_body_counts_every_window_size() {
    let r = router().await;
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/1.2.3.4/increment",
        None,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["namespace"], "api");
    assert_eq!(v["key"], "1.2.3.4");
    let w = v["windows"].as_array().expect("windows");
    assert_eq!(w.len(), 2);
    for field in ["window_size", "window_start", "current", "previous", "rate"] {
        assert!(w[0].get(field).is_some(), "{field} missing in {v}");
    }
    assert_eq!(w[1]["current"], 1.0);
}

#[tokio::test]
async fn increment_one_window_with_a_value_then_read_it() {
    let r = router().await;
    let (s, v) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/k/increment",
        JSON,
        r#"{"value": 2.5, "window_size": 60}"#,
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{v}");
    assert_eq!(v["windows"][0]["current"], 2.5);
    let (s, v) = call(
        &r,
        "GET",
        "/v1/namespaces/api/keys/k?window_size=60",
        None,
        "",
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(v["windows"][0]["current"], 2.5);
    assert_eq!(v["windows"].as_array().expect("windows").len(), 1);
}

#[tokio::test]
async fn keys_are_percent_decoded_utf8() {
    let r = router().await;
    for (path, key) in [
        ("a%2Fb", "a/b"),
        ("with%20space", "with space"),
        ("x%3Ay", "x:y"),
        ("100%25", "100%"),
        ("%D0%BA%D0%BB%D1%8E%D1%87", "ключ"),
    ] {
        let (s, v) = call(
            &r,
            "POST",
            &format!("/v1/namespaces/api/keys/{path}/increment"),
            None,
            "",
        )
        .await;
        assert_eq!(s, StatusCode::OK, "{path}: {v}");
        assert_eq!(v["key"], key);
    }
}

#[tokio::test]
async fn batch_answers_in_order() {
    let r = router().await;
    let body = r#"{"increments":[{"namespace":"api","key":"a","value":1,"window_size":60},{"namespace":"api","key":"a","value":2,"window_size":60},{"namespace":"api","key":"b"}]}"#;
    let (s, v) = call(&r, "POST", "/v1/increments", JSON, body).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    let res = v["results"].as_array().expect("results");
    assert_eq!(res.len(), 3);
    assert_eq!(res[1]["windows"][0]["current"], 3.0);
    assert_eq!(res[2]["key"], "b");
}

#[tokio::test]
/// A table of every bad input beside its status and error code: long because the table is.
async fn bad_input_gets_its_status_and_a_json_error() {
    let r = router().await;
    let long = "k".repeat(1025);
    let big = "x".repeat(5000);
    let cases: Vec<Case> = vec![
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            "{",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"value":"1"}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"value":1e400}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"window_size":30}"#,
            StatusCode::BAD_REQUEST,
            "unknown_window_size",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            JSON,
            r#"{"bogus":1}"#,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            "POST",
            format!("/v1/namespaces/api/keys/{long}/increment"),
            None,
            "",
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            "POST",
            "/v1/namespaces/nope/keys/k/increment".into(),
            None,
            "",
            StatusCode::NOT_FOUND,
            "unknown_namespace",
        ),
        (
            "GET",
            "/v1/nothing".into(),
            None,
            "",
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "DELETE",
            "/v1/increments".into(),
            None,
            "",
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "POST",
            "/v1/namespaces/api/keys/k/increment".into(),
            Some("text/plain"),
            "value=1",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/v1/increments".into(),
            JSON,
            &big,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            "POST",
            "/v1/increments".into(),
            JSON,
            r#"{"increments":[{"namespace":"api","key":""}]}"#,
            StatusCode::BAD_REQUEST,
            "invalid_key",
        ),
        (
            "GET",
            "/v1/namespaces/api/keys/k?window_size=abc".into(),
            None,
            "",
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
    ];
    for (method, uri, ctype, body, status, code) in cases {
        let (s, v) = call(&r, method, &uri, ctype, body).await;
        assert_eq!(
            s,
            status,
            "{method} {} {body:.40}: {v}",
            &uri[..uri.len().min(60)]
        );
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
    }
    // nothing of the rejected batch was counted
    let (_, v) = call(&r, "GET", "/v1/namespaces/api/keys/k", None, "").await;
    assert_eq!(v["windows"][0]["current"], 0.0);
}

#[tokio::test]
async fn keys_with_nul_are_refused_on_every_route() {
    let r = router().await;
    let routes = [
        ("POST", "/v1/namespaces/api/keys/a%00b/increment", ""),
        ("GET", "/v1/namespaces/api/keys/a%00b", ""),
        ("DELETE", "/v1/namespaces/api/keys/a%00b", ""),
        ("POST", "/v1/namespaces/login/keys/a%00b/hit", ""),
        ("POST", "/v1/namespaces/login/keys/a%00b/refund", ""),
        (
            "POST",
            "/v1/hits",
            r#"{"hits":[{"namespace":"login","key":"a\u0000b"}]}"#,
        ),
        (
            "POST",
            "/v1/increments",
            r#"{"increments":[{"namespace":"api","key":"a\u0000b"}]}"#,
        ),
    ];
    for (method, uri, body) in routes {
        let ctype = (!body.is_empty()).then_some("application/json");
        let (status, json) = call(&r, method, uri, ctype, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {uri}: {json}");
        assert_eq!(
            json["error"]["code"], "invalid_key",
            "{method} {uri}: {json}"
        );
    }
}

#[tokio::test]
async fn values_that_would_leave_exact_counts_are_refused_before_counting() {
    let r = router().await;
    let inc = |value: &str| format!(r#"{{"value": {value}, "window_size": 60}}"#);
    let uri = "/v1/namespaces/api/keys/huge/increment";
    // 9007199254740993 parses to the double 2^53: refused with 2^53 itself
    for bad in [
        "1e308",
        "-1e308",
        "9007199254740994",
        "9007199254740993",
        "9007199254740992",
        "1e16",
    ] {
        let (status, json) = call(&r, "POST", uri, JSON, &inc(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {json}");
        assert_eq!(json["error"]["code"], "invalid_value", "{bad}: {json}");
    }
    // 2^52 and 2^52 − 1 make 2^53 − 1: fine; one more would reach 2^53 (and the next
    // would vanish in rounding): refused untouched
    for v in ["4503599627370496", "4503599627370495"] {
        let (status, json) = call(&r, "POST", uri, JSON, &inc(v)).await;
        assert_eq!(status, StatusCode::OK, "{json}");
    }
    let (status, json) = call(&r, "POST", uri, JSON, &inc("1")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["error"]["code"], "invalid_value");
    assert_eq!(current(&r, "api", "huge", 60).await, 9007199254740991.0);
}

#[tokio::test]
async fn negative_values_only_where_the_namespace_allows_decrements() {
    let r = router().await;
    let body = r#"{"value": -100, "window_size": 60}"#;
    let (status, json) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/k/increment",
        JSON,
        body,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["error"]["code"], "invalid_value");
    assert_eq!(current(&r, "api", "k", 60).await, 0.0);
    let batch = r#"{"increments":[{"namespace":"api","key":"k","value":1},{"namespace":"api","key":"k","value":-5}]}"#;
    let (status, json) = call(&r, "POST", "/v1/increments", JSON, batch).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("increments[1]")),
        "{json}"
    );
    assert_eq!(
        current(&r, "api", "k", 60).await,
        0.0,
        "nothing of the batch counted"
    );

    let (status, json) = call(
        &r,
        "POST",
        "/v1/namespaces/signed/keys/k/increment",
        JSON,
        body,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    // a count stops at zero, as in every store (it answered −100)
    assert_eq!(json["windows"][0]["current"], 0.0, "{json}");
    assert_eq!(current(&r, "signed", "k", 60).await, 0.0);
}

#[tokio::test]
async fn bodies_are_json_objects_and_batches_need_a_body() {
    let r = router().await;
    for (uri, body) in [
        ("/v1/namespaces/api/keys/k/increment", "[5, 60]"),
        ("/v1/namespaces/login/keys/k/hit", "[1, false]"),
        ("/v1/namespaces/login/keys/k/refund", "[1]"),
        ("/v1/increments", r#"[[{"namespace":"api","key":"k"}]]"#),
        ("/v1/hits", r#"[[{"namespace":"login","key":"k"}], false]"#),
    ] {
        let (status, json) = call(&r, "POST", uri, JSON, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{uri} {body}: {json}");
    }
    assert_eq!(current(&r, "api", "k", 60).await, 0.0);
    let (status, json) = call(&r, "POST", "/v1/increments", None, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(json["error"]["code"], "bad_request");
}

#[tokio::test]
async fn a_batch_that_fails_part_way_leaves_nothing_counted() {
    let r = router().await;
    // /v1/hits: the unknown namespace comes after a hit that would be allowed
    let hits = r#"{"hits":[{"namespace":"login","key":"b"},{"namespace":"nope","key":"b"}]}"#;
    let (status, json) = call(&r, "POST", "/v1/hits", JSON, hits).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
    assert_eq!(current(&r, "login", "b", 60).await, 0.0);
    // a bad cost further on
    let hits =
        r#"{"hits":[{"namespace":"login","key":"b"},{"namespace":"login","key":"c","cost":9}]}"#;
    let (status, json) = call(&r, "POST", "/v1/hits", JSON, hits).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_eq!(current(&r, "login", "b", 60).await, 0.0);

    // `tiny` holds two keys per window size, every hit unsynced: fill size 60
    let one = |key: &str, size: u32| {
        format!(r#"{{"namespace":"tiny","key":"{key}","window_size":{size}}}"#)
    };
    let batch = format!(r#"{{"increments":[{},{}]}}"#, one("a", 60), one("b", 60));
    let (status, json) = call(&r, "POST", "/v1/increments", JSON, &batch).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    // a known key, then a new one the full table refuses: the first goes back out
    let batch = format!(r#"{{"increments":[{},{}]}}"#, one("a", 60), one("c", 60));
    let (status, json) = call(&r, "POST", "/v1/increments", JSON, &batch).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    assert_eq!(
        current(&r, "tiny", "a", 60).await,
        1.0,
        "a retry counts it once"
    );
    // every window size: size 1 has room, size 60 refuses, so size 1 gives it back
    let (status, json) = call(&r, "POST", "/v1/namespaces/tiny/keys/c/increment", None, "").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{json}");
    let (_, json) = call(
        &r,
        "GET",
        "/v1/namespaces/tiny/keys/c?window_size=1",
        None,
        "",
    )
    .await;
    assert_eq!(json["windows"][0]["current"], 0.0, "{json}");
}

/// A value is counted exactly as the client wrote it: serde_json's default parser can be
/// an ulp off (found by the whole-chain property), so bodies are parsed exactly.
#[tokio::test]
async fn values_are_parsed_exactly() {
    let r = router().await;
    let value = 1.2750726484814737e-227_f64;
    let body = format!(r#"{{"value": {value:e}, "window_size": 60}}"#);
    let (status, json) = call(
        &r,
        "POST",
        "/v1/namespaces/api/keys/exact/increment",
        JSON,
        &body,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(
        current(&r, "api", "exact", 60).await.to_bits(),
        value.to_bits()
    );
}
