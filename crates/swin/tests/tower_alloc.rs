//! A request the layer lets pass unlimited (its key is `None`) costs no allocation: the
//! inner service's own future, nothing boxed. Counted on this thread around the layer's
//! `call` and the poll of its future.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use swin::tower::LimiterLayer;
use tower::{Layer, Service};

#[tokio::test(flavor = "current_thread")]
async fn a_request_passed_unlimited_allocates_nothing() {
    let limiter = service_limiter().await;
    let none = |_: &Request<()>| -> Option<String> { None };
    let layer = LimiterLayer::builder(limiter, "api")
        .key(none)
        .build()
        .expect("layer");
    let inner = tower::service_fn(|_: Request<()>| {
        std::future::ready(Ok::<_, Infallible>(Response::new(())))
    });
    let mut service = layer.layer(inner);
    let mut cx = Context::from_waker(Waker::noop());
    for round in 0..3 {
        let request = Request::new(());
        let mut polled = None;
        let made = allocation_counter::measure(|| {
            assert!(service.poll_ready(&mut cx).is_ready());
            let mut answer = std::pin::pin!(service.call(request));
            polled = Some(answer.as_mut().poll(&mut cx));
        });
        assert!(matches!(polled, Some(Poll::Ready(Ok(_)))), "round {round}");
        assert_eq!(
            made.count_total, 0,
            "allocations of a request passed unlimited, round {round}"
        );
    }
    // the counter counts: a request with a key is decided, boxed
    let key = |_: &Request<()>| -> Option<String> { Some("k".into()) };
    let mut keyed = LimiterLayer::builder(service_limiter().await, "api")
        .key(key)
        .build()
        .expect("layer")
        .layer(tower::service_fn(|_: Request<()>| {
            std::future::ready(Ok::<_, Infallible>(Response::new(())))
        }));
    let made = allocation_counter::measure(|| {
        let _answer = keyed.call(Request::new(()));
    });
    assert!(made.count_total > 0, "the counter counts");
}

async fn service_limiter() -> Arc<swin::Limiter> {
    let config = swin::config::Config::from_toml(
        "[[namespaces]]\nname = \"api\"\nsync_rate = -1\nwindow_sizes = [60]\n\
         limits = [{ window_size = 60, limit = 3 }]\n",
    )
    .expect("config");
    Arc::new(swin::Limiter::start(config).await.expect("start"))
}
