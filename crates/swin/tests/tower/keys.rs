//! The layer's ready key extractors against hostile clients: a header's bytes past ASCII
//! are counted (never let through), two such headers are two keys, a header too long for
//! a key is 400, a request without the header is 400 (never let through); the peer
//! address (from axum's `ConnectInfo` or a plain `SocketAddr`) ignores the port and the forwarding headers; the
//! client address believes X-Forwarded-For from trusted proxies only; a request without
//! a peer address is refused, never let through.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode};
use axum::Router;
use swin::tower::{ClientAddr, HeaderKey, PeerAddr};
use tower::ServiceExt;

use super::{keyed_app, limiter, LOCAL};

/// 5 per minute per key, local to this process.
const FIVE: &str = "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
    limits = [{ window_size = 60, limit = 5 }]\n";

/// A GET of `/` from `peer` (none: no `ConnectInfo`) with `headers` (raw bytes).
fn get(peer: Option<&str>, headers: &[(&str, &[u8])]) -> Request<Body> {
    let mut r = Request::get("/");
    for (name, value) in headers {
        r = r.header(*name, HeaderValue::from_bytes(value).expect("header bytes"));
    }
    let mut r = r.body(Body::empty()).expect("request");
    if let Some(p) = peer {
        let addr: SocketAddr = p.parse().expect("socket address");
        r.extensions_mut().insert(ConnectInfo(addr));
    }
    r
}

/// The status of each of `requests`, sent in order.
async fn statuses(app: &Router, requests: Vec<Request<Body>>) -> Vec<u16> {
    let mut out = Vec::new();
    for r in requests {
        let answer = app.clone().oneshot(r).await.expect("answer");
        out.push(answer.status().as_u16());
    }
    out
}

#[tokio::test]
async fn a_header_past_ascii_is_counted_never_let_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(
        limiter("", FIVE).await,
        calls.clone(),
        HeaderKey::new("x-client"),
    );
    let hostile = b"\xff\xfe\x80client";
    let requests = (0..15).map(|_| get(None, &[("x-client", hostile)]));
    let got = statuses(&app, requests.collect()).await;
    assert_eq!(got[..5], [200; 5]);
    assert_eq!(got[5..], [429; 10]);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        5,
        "admitted past a limit of 5"
    );
}

#[tokio::test]
async fn headers_that_differ_past_ascii_are_two_keys() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(
        limiter("", LOCAL).await,
        calls.clone(),
        HeaderKey::new("x-client"),
    );
    let one = |v: &'static [u8]| get(None, &[("x-client", v)]);
    let got = statuses(
        &app,
        vec![one(b"\xff"), one(b"\xff"), one(b"\xff"), one(b"\xff")],
    )
    .await;
    assert_eq!(got, [200, 200, 200, 429]);
    // another byte, and the text the escaped byte spells, are keys of their own
    let got = statuses(&app, vec![one(b"\xfe"), one(b"%FF"), one(b"%25FF")]).await;
    assert_eq!(got, [200, 200, 200]);
}

#[tokio::test]
async fn a_header_too_long_for_a_key_is_400_never_let_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(
        limiter("", LOCAL).await,
        calls.clone(),
        HeaderKey::new("x-client"),
    );
    let max = 1024; // the longest key (docs/api.md)
    let long = vec![b'a'; max + 1];
    // 342 bytes past ASCII escape to 1026 bytes of key
    let escaped_long = vec![0xff; 342];
    let got = statuses(
        &app,
        vec![
            get(None, &[("x-client", &long)]),
            get(None, &[("x-client", &escaped_long)]),
            get(None, &[("x-client", b"")]),
        ],
    )
    .await;
    assert_eq!(got, [400, 400, 400]);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // the longest key there is, is counted
    let longest = vec![b'a'; max];
    let got = statuses(&app, vec![get(None, &[("x-client", &longest)])]).await;
    assert_eq!(got, [200]);
}

#[tokio::test]
async fn the_peer_address_is_the_key_whatever_the_port_or_the_headers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(limiter("", LOCAL).await, calls.clone(), PeerAddr);
    let requests = (0..4u16).map(|i| {
        let spoof = format!("198.51.100.{i}");
        let peer = format!("203.0.113.7:{}", 1000 + i);
        get(Some(&peer), &[("x-forwarded-for", spoof.as_bytes())])
    });
    let got = statuses(&app, requests.collect()).await;
    assert_eq!(got, [200, 200, 200, 429]);
    // the same address mapped into IPv6 is the same client; another address is another
    let got = statuses(
        &app,
        vec![
            get(Some("[::ffff:203.0.113.7]:1"), &[]),
            get(Some("203.0.113.8:1"), &[]),
        ],
    )
    .await;
    assert_eq!(got, [429, 200]);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_request_without_a_peer_address_is_refused_never_let_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let limiter = limiter("", LOCAL).await;
    let by_client = ClientAddr::new(["127.0.0.1"]).expect("proxies");
    for app in [
        keyed_app(limiter.clone(), calls.clone(), PeerAddr),
        keyed_app(limiter, calls.clone(), by_client),
    ] {
        let got = statuses(&app, vec![get(None, &[("x-forwarded-for", b"1.2.3.4")])]).await;
        assert_eq!(got, [500]);
        let grpc = get(None, &[("content-type", b"application/grpc")]);
        let answer = app.clone().oneshot(grpc).await.expect("answer");
        assert_eq!(answer.headers()["grpc-status"], "13");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn the_client_address_is_believed_from_trusted_proxies_only() {
    let calls = Arc::new(AtomicUsize::new(0));
    let by_client = ClientAddr::new(["10.0.0.0/8"]).expect("proxies");
    let app = keyed_app(limiter("", LOCAL).await, calls.clone(), by_client);
    // behind the proxy: the right-most hop it does not trust, whatever the client wrote
    // to its left
    let requests = (0..4).map(|i| {
        let chain = format!("6.6.6.{i}, 203.0.113.7, 10.0.0.9");
        get(
            Some("10.0.0.1:4711"),
            &[("x-forwarded-for", chain.as_bytes())],
        )
    });
    let got = statuses(&app, requests.collect()).await;
    assert_eq!(got, [200, 200, 200, 429]);
    // the same client straight from its own address is the same key
    let got = statuses(&app, vec![get(Some("203.0.113.7:1"), &[])]).await;
    assert_eq!(got, [429]);
    // an untrusted peer's X-Forwarded-For and X-Real-IP are ignored: a new value each
    // time is still the peer's one key
    let spoofed = (0..4).map(|i| {
        let forged = format!("192.0.2.{i}");
        let headers: [(&str, &[u8]); 2] = [
            ("x-forwarded-for", forged.as_bytes()),
            ("x-real-ip", forged.as_bytes()),
        ];
        get(Some("198.51.100.1:1"), &headers)
    });
    let got = statuses(&app, spoofed.collect()).await;
    assert_eq!(got, [200, 200, 200, 429]);
    // a trusted proxy passing what is not an address: refused, never let through
    let got = statuses(
        &app,
        vec![get(Some("10.0.0.1:1"), &[("x-forwarded-for", b"alice")])],
    )
    .await;
    assert_eq!(got, [400]);
    assert_eq!(calls.load(Ordering::SeqCst), 6);
    assert!(ClientAddr::new(["proxy.local"]).is_err());
}

/// Served over a socket as the module's documentation shows: axum's ConnectInfo reaches
/// the layer, and the fourth request from 127.0.0.1 is refused.
#[tokio::test]
async fn a_served_router_gives_the_peer_address() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(limiter("", LOCAL).await, calls.clone(), PeerAddr);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}/", listener.local_addr().expect("addr"));
    let served = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, served).await });
    let mut got = Vec::new();
    for _ in 0..4 {
        // a new connection each time: a new port, the same key
        let client = reqwest::Client::new();
        let answer = client.get(&base).send().await.expect("answer");
        got.push(answer.status());
    }
    assert_eq!(got[3], StatusCode::TOO_MANY_REQUESTS, "{got:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Leaving the header out is not a way past the limit: 400, naming the header, and the
/// route never reached (it used to pass unlimited).
#[tokio::test]
async fn a_request_without_the_header_is_refused_never_let_through() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(
        limiter("", FIVE).await,
        calls.clone(),
        HeaderKey::new("x-client"),
    );
    let requests = (0..10).map(|_| get(Some("203.0.113.7:4000"), &[]));
    assert_eq!(statuses(&app, requests.collect()).await, [400; 10]);
    assert_eq!(calls.load(Ordering::SeqCst), 0, "let through without a key");
    let answer = app.clone().oneshot(get(None, &[])).await.expect("answer");
    assert_eq!(answer.status(), StatusCode::BAD_REQUEST);
}

/// A server that puts the peer as a plain `SocketAddr` in the extensions (tonic's
/// users, with a `map_request`) is served: keyed by it, not refused 500.
#[tokio::test]
async fn the_peer_address_is_read_from_a_plain_socket_address_too() {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = keyed_app(limiter("", FIVE).await, calls.clone(), PeerAddr);
    let from = |p: &str| {
        let mut r = get(None, &[]);
        r.extensions_mut()
            .insert(p.parse::<SocketAddr>().expect("socket address"));
        r
    };
    let requests = (0..7).map(|i| from(&format!("198.51.100.9:{}", 5000 + i)));
    let got = statuses(&app, requests.collect()).await;
    assert_eq!(got, [200, 200, 200, 200, 200, 429, 429]);
    assert_eq!(statuses(&app, vec![from("198.51.100.10:1")]).await, [200]);
}
