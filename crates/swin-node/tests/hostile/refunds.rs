//! Envoy's negative hits on a namespace that limits hits (refunds) through a store that
//! goes away: a refund needs the key's count in the store (it never gives back below
//! zero there), so while the store is gone it is UNAVAILABLE and gives nothing back, in
//! periodic and synchronous mode alike; once the store is back it gives back exactly
//! what it says, and a node that never saw the key admits exactly the rest.

use std::time::Duration;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use swin_testkit::cluster::{within, TestStore};
use tonic::transport::Channel;

use super::support::{envoy, node, OwnRedis};

const LIMIT: u32 = 5;

fn config(store: &TestStore, grpc_port: u16) -> String {
    let ns = |name: &str, sync_rate: &str| {
        format!(
            "[[namespaces]]
name = \"{name}\"
sync_rate = {sync_rate}
store = \"main\"
[[namespaces.descriptors]]
key = \"user\"
rate_limit = {{ unit = \"hour\", requests_per_unit = {LIMIT} }}
"
        )
    };
    format!(
        "store_timeout = 1\ngrpc_listen = \"127.0.0.1:{grpc_port}\"\n{}\n{}{}",
        store.section(),
        ns("periodic", "0.2"),
        ns("synchronous", "0"),
    )
}

async fn connect(port: u16) -> RateLimitServiceClient<Channel> {
    swin_testkit::wait_for_port(port, Duration::from_secs(30));
    RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("connect")
}

/// Hits of one at a time until one is over the limit: how many were OK.
async fn admitted(c: &mut RateLimitServiceClient<Channel>, domain: &str, key: &str) -> u32 {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    let mut n = 0;
    while envoy(c, domain, key, 1, false).await == Ok(Code::Ok as i32) {
        n += 1;
        assert!(n <= LIMIT, "{domain}: more than the limit admitted");
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_refunds_through_a_gone_store_give_back_nothing_then_exactly() {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    const OK: i32 = Code::Ok as i32;
    const OVER: i32 = Code::OverLimit as i32;
    let grpc_port = swin_testkit::free_port();
    let mut own = OwnRedis::start(|s| config(s, grpc_port));
    let mut a = connect(grpc_port).await;
    for domain in ["periodic", "synchronous"] {
        assert_eq!(
            envoy(&mut a, domain, "k", u64::from(LIMIT), false).await,
            Ok(OK)
        );
        assert_eq!(envoy(&mut a, domain, "k", 1, false).await, Ok(OVER));
    }
    // the periodic namespace's hits reach the store before it goes
    tokio::time::sleep(Duration::from_millis(600)).await;

    drop(own.server.take()); // the store goes away
    for domain in ["periodic", "synchronous"] {
        assert_eq!(
            envoy(&mut a, domain, "k", 3, true).await,
            Err(tonic::Code::Unavailable),
            "{domain}: a refund the store cannot see"
        );
    }
    // nothing was given back: still over the limit where the node decides alone
    assert_eq!(envoy(&mut a, "periodic", "k", 1, false).await, Ok(OVER));

    own.restart();
    within(
        Duration::from_secs(15),
        "the store answers again",
        async || envoy(&mut a, "synchronous", "k", 1, false).await == Ok(OVER),
    )
    .await;
    for domain in ["periodic", "synchronous"] {
        // a refund waits answer_timeout at most for its read of the key (a sync that
        // still reconnects may hold the push lock that long): UNAVAILABLE gives nothing
        // back, and is retried
        within(
            Duration::from_secs(10),
            "a refund goes through",
            async || {
                let r = envoy(&mut a, domain, "k", 2, true).await;
                assert!(
                    matches!(r, Ok(OK) | Err(tonic::Code::Unavailable)),
                    "{domain}: {r:?}"
                );
                r == Ok(OK)
            },
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(600)).await;

    // a node that never saw the key: exactly the 2 given back, in both modes
    let b_grpc = swin_testkit::free_port();
    let store = TestStore::redis_at(&format!("redis://127.0.0.1:{}", own.port), "hostile");
    let b_dir = tempfile::tempdir().expect("dir");
    let b_config = b_dir.path().join("swin.toml");
    std::fs::write(&b_config, config(&store, b_grpc)).expect("config");
    let mut b_node = node(&b_config);
    let mut b = connect(b_grpc).await;
    for domain in ["periodic", "synchronous"] {
        assert_eq!(admitted(&mut b, domain, "k").await, 2, "{domain} on B");
    }
    assert!(b_node.terminate());
    assert!(own.node.terminate());
}
