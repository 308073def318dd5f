//! The layer's builder and what it is built with: a namespace it cannot decide, or a
//! fixed cost no hit can have, fails at build time, not at every request; a cost per
//! request (a number, or read from the request); an error hook that answers refusals (a
//! denial keeps its headers; a gRPC request gets a gRPC refusal); a namespace a reload
//! removed is the server's error (500), not the store's (503); the old name,
//! deprecated, still builds the same layer.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use axum::{routing::get, Router};
use swin::tower::{BuildError, HeaderKey, LimiterLayer, Refused};
use tower::ServiceExt;

use super::{app, limiter, request, LOCAL};

/// `LOCAL`, a namespace that only counts, and one of leases.
const MIXED: &str = "[[namespaces]]\nname = \"counts\"\nsync_rate = -1\nwindow_sizes = [60]\n\
    [[namespaces]]\nname = \"slots\"\nalgorithm = \"concurrency\"\nlimit = 2\n\
    lease_ttl = 30\nsync_rate = -1\n";

#[tokio::test]
async fn a_namespace_the_layer_cannot_decide_fails_at_build_time() {
    let limiter = limiter("", &format!("{LOCAL}{MIXED}")).await;
    let build = |ns: &str| {
        LimiterLayer::builder(limiter.clone(), ns)
            .key(HeaderKey::new("x-client"))
            .build()
            .map(drop)
    };
    assert_eq!(
        build("nope"),
        Err(BuildError::UnknownNamespace("nope".into()))
    );
    assert_eq!(build("counts"), Err(BuildError::NoLimits("counts".into())));
    assert_eq!(build("slots"), Err(BuildError::Leases("slots".into())));
    let e = build("slots").expect_err("leases");
    assert!(e.to_string().contains("\"slots\""), "{e}");
    assert_eq!(build("api"), Ok(()));
}

async fn status_of(app: &Router, client: &str, cost: Option<&str>) -> (StatusCode, String) {
    let mut r = Request::get("/").header("x-client", client);
    if let Some(c) = cost {
        r = r.header("x-cost", c);
    }
    let r = app
        .clone()
        .oneshot(r.body(Body::empty()).expect("request"))
        .await
        .expect("answer");
    let remaining = r
        .headers()
        .get("ratelimit")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (r.status(), remaining)
}

#[tokio::test]
async fn each_request_costs_what_the_layer_says() {
    let limiter = limiter("", LOCAL).await;
    let route = || Router::new().route("/", get(|| async { "ok" }));
    let two = route().layer(
        LimiterLayer::builder(limiter.clone(), "api")
            .key(HeaderKey::new("x-client"))
            .cost(2.0)
            .build()
            .expect("layer"),
    );
    // 3 a minute: a request of 2, then one of 2 more is refused (1 left)
    let (s, rl) = status_of(&two, "a", None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(rl.contains("r=1"), "{rl}");
    assert_eq!(
        status_of(&two, "a", None).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // the cost read from the request; one the limiter refuses is 400, never let through
    let by_header = |r: &Request<Body>| -> f64 {
        r.headers()
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1.0)
    };
    let read = route().layer(
        LimiterLayer::builder(limiter, "api")
            .key(HeaderKey::new("x-client"))
            .cost(by_header)
            .build()
            .expect("layer"),
    );
    assert_eq!(status_of(&read, "b", Some("3")).await.0, StatusCode::OK);
    assert_eq!(
        status_of(&read, "c", Some("-1")).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        status_of(&read, "c", Some("NaN")).await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(status_of(&read, "c", Some("1")).await.0, StatusCode::OK);
    assert_eq!(
        status_of(&read, "b", None).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_error_hook_answers_refusals_and_a_denial_keeps_its_headers() {
    let limiter = limiter("", LOCAL).await;
    let hook = |why: Refused<'_>| -> Response<Body> {
        let (status, text) = match why {
            Refused::Denied(_) => (StatusCode::SERVICE_UNAVAILABLE, "slow down"),
            Refused::Undecided(_) => (StatusCode::IM_A_TEAPOT, "undecided"),
            _ => (StatusCode::FORBIDDEN, "no key"),
        };
        let mut r = Response::new(Body::from(text));
        *r.status_mut() = status;
        r
    };
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        LimiterLayer::builder(limiter, "api")
            .key(HeaderKey::new("x-client"))
            .on_refused(hook)
            .build()
            .expect("layer"),
    );
    for _ in 0..3 {
        assert_eq!(status_of(&app, "a", None).await.0, StatusCode::OK);
    }
    let r = app
        .clone()
        .oneshot(request(Some("a")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        r.headers().get("retry-after").is_some(),
        "{:?}",
        r.headers()
    );
    assert!(r.headers().get("ratelimit-policy").is_some());
    let body = axum::body::to_bytes(r.into_body(), 1024)
        .await
        .expect("body");
    assert_eq!(&body[..], b"slow down");
    // an empty header value: a key the limiter refuses
    let r = app
        .clone()
        .oneshot(request(Some("")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::IM_A_TEAPOT);
}

#[tokio::test]
#[allow(deprecated)]
async fn the_old_name_still_builds_the_layer() {
    let old_limiter = limiter("", LOCAL).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let old =
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(swin::tower::RateLimitLayer::new(
                old_limiter,
                "api",
                HeaderKey::new("x-client"),
            ));
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(status_of(&old, "a", None).await.0.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    // the current shape, for comparison: the same answers
    let new = app(limiter("", LOCAL).await, calls);
    let mut statuses = Vec::new();
    for _ in 0..4 {
        let r = new
            .clone()
            .oneshot(request(Some("a")))
            .await
            .expect("answer");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
}

#[tokio::test]
async fn a_fixed_cost_no_hit_can_have_fails_at_build_time() {
    let limiter = limiter("", LOCAL).await;
    for cost in [-1.0, f64::NAN, f64::INFINITY] {
        let built = LimiterLayer::builder(limiter.clone(), "api")
            .key(HeaderKey::new("x-client"))
            .cost(cost)
            .build()
            .map(drop);
        assert!(
            matches!(built, Err(BuildError::Cost(_))),
            "{cost}: {built:?}"
        );
    }
    let built = LimiterLayer::builder(limiter, "api")
        .key(HeaderKey::new("x-client"))
        .cost(2.5)
        .build()
        .map(drop);
    assert_eq!(built, Ok(()));
}

/// A hook that answers HTTP to a gRPC request: the layer makes it a gRPC refusal (a
/// gRPC client reads HTTP 429 as UNAVAILABLE and retries); a hook's own grpc-status is
/// kept.
#[tokio::test]
async fn a_hook_answering_a_grpc_request_gives_a_grpc_refusal() {
    let limiter = limiter("", LOCAL).await;
    let hook = |why: Refused<'_>| -> Response<Body> {
        let mut r = Response::new(Body::empty());
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        if matches!(why, Refused::NoKey(_)) {
            r.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static("7"));
        }
        r
    };
    let app = Router::new().route("/", get(|| async { "ok" })).layer(
        LimiterLayer::builder(limiter, "api")
            .key(HeaderKey::new("x-client"))
            .on_refused(hook)
            .build()
            .expect("layer"),
    );
    let grpc = |client: Option<&str>| {
        let mut r = request(client);
        r.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("application/grpc"),
        );
        r
    };
    for _ in 0..3 {
        let r = app.clone().oneshot(grpc(Some("a"))).await.expect("answer");
        assert_eq!(r.status(), StatusCode::OK);
    }
    let r = app.clone().oneshot(grpc(Some("a"))).await.expect("answer");
    assert_eq!(r.status(), StatusCode::OK, "a gRPC refusal is HTTP 200");
    assert_eq!(r.headers()["grpc-status"], "8", "{:?}", r.headers());
    assert_eq!(r.headers()["content-type"], "application/grpc");
    let r = app.clone().oneshot(grpc(None)).await.expect("answer");
    assert_eq!(r.headers()["grpc-status"], "7", "the hook's own status");
    // an HTTP request gets what the hook answered
    let r = app
        .clone()
        .oneshot(request(Some("a")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().get("grpc-status").is_none());
}

/// A reload that removes the layer's namespace: every keyed request is refused 500 (the
/// server's configuration), not 503 as if a store were down.
#[tokio::test]
async fn a_namespace_a_reload_removed_is_a_server_error() {
    let limiter = limiter("", LOCAL).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter.clone(), calls.clone());
    assert_eq!(status_of(&app, "a", None).await.0, StatusCode::OK);
    let other = LOCAL.replace("name = \"api\"", "name = \"other\"");
    let config = swin::config::Config::from_toml(&other).expect("config");
    limiter.reconfigure(config).await.expect("reload");
    assert_eq!(
        status_of(&app, "a", None).await.0,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}
