//! `swin::tower::LimiterLayer` in front of axum routes and a tonic server, without a
//! socket for axum (the router is called as a service): a request without a key passes
//! unlimited; an allowed one reaches the route and carries the RateLimit headers; a
//! denied one is 429 with `Retry-After` and never reaches the route (gRPC:
//! RESOURCE_EXHAUSTED); a key the limiter refuses is 400, never let through; two
//! services with limiters of their own on one store share one limit. The ready key
//! extractors against hostile clients are in `tower/keys.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::{routing::get, Router};
use swin::tower::{KeyExtractor, LimiterLayer};
use tower::ServiceExt;

#[path = "tower/builder.rs"]
mod builder;
#[path = "tower/keys.rs"]
mod keys;

/// A limiter of `namespaces` (TOML) on `store` (a `[stores.shared]` section, or none).
async fn limiter(store: &str, namespaces: &str) -> Arc<swin::Limiter> {
    let config =
        swin::config::Config::from_toml(&format!("{store}\n{namespaces}")).expect("config");
    Arc::new(swin::Limiter::start(config).await.expect("start"))
}

/// 3 per minute per key, local to this process.
const LOCAL: &str = "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
    limits = [{ window_size = 60, limit = 3 }]\n";

fn by_client(r: &Request<Body>) -> Option<String> {
    r.headers()
        .get("x-client")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// A router whose route counts its calls, behind the layer keyed by the closure
/// `by_client`.
fn app(limiter: Arc<swin::Limiter>, calls: Arc<AtomicUsize>) -> Router {
    keyed_app(limiter, calls, by_client)
}

/// A router whose route counts its calls, behind the layer keyed by `key`.
fn keyed_app<K>(limiter: Arc<swin::Limiter>, calls: Arc<AtomicUsize>, key: K) -> Router
where
    K: KeyExtractor<Body> + Clone + Send + Sync + 'static,
{
    Router::new()
        .route(
            "/",
            get(move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                "ok"
            }),
        )
        .layer(
            LimiterLayer::builder(limiter, "api")
                .key(key)
                .build()
                .expect("layer"),
        )
}

fn request(client: Option<&str>) -> Request<Body> {
    let mut r = Request::get("/");
    if let Some(c) = client {
        r = r.header("x-client", c);
    }
    r.body(Body::empty()).expect("request")
}

#[tokio::test]
async fn allowed_requests_carry_the_headers_and_denied_ones_never_reach_the_route() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter("", LOCAL).await, calls.clone());
    for left in [2, 1, 0] {
        let r = app
            .clone()
            .oneshot(request(Some("a")))
            .await
            .expect("answer");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["ratelimit-policy"], "\"60s\";q=3;w=60");
        let state = r.headers()["ratelimit"].to_str().expect("text");
        assert!(
            state.starts_with(&format!("\"60s\";r={left};t=")),
            "{state}"
        );
        assert!(r.headers().get("retry-after").is_none());
    }
    let r = app
        .clone()
        .oneshot(request(Some("a")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .expect("text")
        .parse()
        .expect("secs");
    // a sliding window: the hit passes once the earlier window weighs less, within two
    assert!((1..=120).contains(&retry), "{retry}");
    assert!(r.headers()["ratelimit"]
        .to_str()
        .expect("text")
        .contains(";r=0;"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the denied request reached the route"
    );
    // another key has its own limit
    let r = app
        .clone()
        .oneshot(request(Some("b")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::OK);
}

/// Two layers stacked (a limit per client outside, one for all inside): an answer
/// carries the RateLimit fields of both, so that a client sees every limit it passed
/// (the outer layer's set over the inner's, and the stricter limit was lost); a denial
/// inside keeps its Retry-After.
#[tokio::test]
async fn stacked_layers_show_every_limit() {
    let namespaces = format!(
        "{LOCAL}[[namespaces]]\nname = \"all\"\nsync_rate = -1\nwindow_sizes = [10]\n\
         limits = [{{ window_size = 10, limit = 2 }}]\n"
    );
    let limiter = limiter("", &namespaces).await;
    let all = |_: &Request<Body>| Some("everyone".to_owned());
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(
            LimiterLayer::builder(limiter.clone(), "all")
                .key(all)
                .build()
                .expect("inner layer"),
        )
        .layer(
            LimiterLayer::builder(limiter, "api")
                .key(by_client)
                .build()
                .expect("outer layer"),
        );
    let policies = |r: &axum::http::Response<Body>, name: &str| -> Vec<String> {
        r.headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("text").to_owned())
            .collect()
    };
    for left in [1, 0] {
        let r = app
            .clone()
            .oneshot(request(Some("a")))
            .await
            .expect("answer");
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            policies(&r, "ratelimit-policy"),
            ["\"10s\";q=2;w=10", "\"60s\";q=3;w=60"],
            "the inner limit's policy, then the outer's"
        );
        let state = policies(&r, "ratelimit");
        assert_eq!(state.len(), 2, "{state:?}");
        assert!(
            state[0].starts_with(&format!("\"10s\";r={left};")),
            "{state:?}"
        );
        assert!(
            state[1].starts_with(&format!("\"60s\";r={};", left + 1)),
            "{state:?}"
        );
    }
    // the inner limit denies: its 429 keeps its Retry-After, and the outer limit's
    // fields join its own
    let r = app
        .clone()
        .oneshot(request(Some("b")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policies(&r, "ratelimit-policy").len(), 2);
    assert_eq!(policies(&r, "retry-after").len(), 1);
    let retry: u64 = policies(&r, "retry-after")[0].parse().expect("secs");
    assert!((1..=20).contains(&retry), "{retry}");
}

#[tokio::test]
async fn a_request_without_a_key_passes_unlimited() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter("", LOCAL).await, calls.clone());
    for _ in 0..10 {
        let r = app.clone().oneshot(request(None)).await.expect("answer");
        assert_eq!(r.status(), StatusCode::OK);
        assert!(r.headers().get("ratelimit").is_none());
    }
    assert_eq!(calls.load(Ordering::SeqCst), 10);
}

#[tokio::test]
async fn a_key_the_limiter_refuses_is_never_let_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter("", LOCAL).await, calls.clone());
    let r = app
        .clone()
        .oneshot(request(Some("")))
        .await
        .expect("answer");
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_grpc_request_over_its_limit_is_resource_exhausted() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = app(limiter("", LOCAL).await, calls.clone());
    let grpc = || {
        Request::get("/")
            .header("x-client", "g")
            .header("content-type", "application/grpc")
            .body(Body::empty())
            .expect("request")
    };
    for _ in 0..3 {
        assert_eq!(
            app.clone().oneshot(grpc()).await.expect("answer").status(),
            200
        );
    }
    let r = app.clone().oneshot(grpc()).await.expect("answer");
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "gRPC answers its status in grpc-status"
    );
    assert_eq!(r.headers()["grpc-status"], "8");
    assert!(r.headers()["grpc-message"]
        .to_str()
        .expect("text")
        .contains("rate limited"));
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Two services, each with a limiter of its own on one SQLite file, decided in the store
/// at every request: one limit of 3 across both.
#[tokio::test]
async fn two_services_on_one_store_share_one_limit() {
    let dir = tempfile::tempdir().expect("dir");
    let store = format!(
        "[stores.shared]\nkind = \"sqlite\"\nurl = \"sqlite://{}\"\n",
        dir.path().join("shared.db").display()
    );
    let shared = "[[namespaces]]\nname = \"api\"\nstore = \"shared\"\nsync_rate = 0\n\
        window_sizes = [60]\nlimits = [{ window_size = 60, limit = 3 }]\n";
    let calls = Arc::new(AtomicUsize::new(0));
    let a = app(limiter(&store, shared).await, calls.clone());
    let b = app(limiter(&store, shared).await, calls.clone());
    let mut statuses = Vec::new();
    for app in [&a, &b, &a, &b, &a, &b] {
        let r = app
            .clone()
            .oneshot(request(Some("c")))
            .await
            .expect("answer");
        statuses.push(r.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Behind a tonic server (the standard health service, called over a socket): the
/// fourth call of a key is RESOURCE_EXHAUSTED and never reaches the service; a call
/// without the key's header is INVALID_ARGUMENT, naming it.
#[tokio::test]
async fn a_tonic_server_behind_the_layer() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let limiter = limiter("", LOCAL).await;
    let by_caller = swin::tower::HeaderKey::new("x-caller");
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tonic::transport::Server::builder()
        .layer(
            LimiterLayer::builder(limiter, "api")
                .key(by_caller)
                .build()
                .expect("layer"),
        )
        .add_service(health)
        .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
    tokio::spawn(server);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    let mut client = HealthClient::new(channel);
    let check = || {
        let mut r = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        r.metadata_mut()
            .insert("x-caller", "t".parse().expect("value"));
        r
    };
    for _ in 0..3 {
        client.check(check()).await.expect("allowed");
    }
    let refused = client.check(check()).await.expect_err("limited");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    // a call without the key is refused, never let through
    let refused = client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect_err("no key");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("x-caller"), "{refused:?}");
}
