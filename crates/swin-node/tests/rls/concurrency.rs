//! Envoy's negative hits on concurrency namespaces, over three node processes on every
//! store: clients that start requests on one node and end them (the same descriptor with
//! `is_negative_hits`) on another never hold more than the limit (the test counts the
//! slots it was granted and has not yet ended, at every grant), a request's descriptors
//! are taken all or nothing, slots Envoy never ends lapse after `lease_ttl`, and the
//! Python grpcio client sets the field by its wire number (xds-protos predates it). On a
//! namespace that limits hits, negative hits give hits back, never below zero.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::google::protobuf::UInt64Value;
use swin_testkit::cluster::TestStore;

use super::{ask, codes, descriptor, start_with, Running, OK, OVER};

const LIMIT: u64 = 4;

fn config(store: &TestStore, sync_rate: f64) -> String {
    format!(
        "store_timeout = 2\n{}
[[namespaces]]
name = \"inflight\"
algorithm = \"concurrency\"
limit = {LIMIT}
lease_ttl = 30
sync_rate = {sync_rate}
store = \"main\"
envoy_response_headers = true

[[namespaces]]
name = \"short\"
algorithm = \"concurrency\"
limit = 2
lease_ttl = 1
sync_rate = {sync_rate}
store = \"main\"

[[namespaces]]
name = \"rates\"
sync_rate = 0
store = \"main\"
[[namespaces.descriptors]]
key = \"user\"
limits = [{{ window_size = 60, limit = 5 }}]
",
        store.section()
    )
}

async fn nodes(store: &TestStore, sync_rate: f64, n: usize) -> Vec<Running> {
    let mut out = Vec::new();
    for _ in 0..n {
        let dir = tempfile::tempdir().expect("dir");
        out.push(start_with(dir, &config(store, sync_rate)).await);
    }
    out
}

fn user(name: &str, negative: bool) -> RateLimitDescriptor {
    RateLimitDescriptor {
        is_negative_hits: negative,
        ..descriptor(&[("user", name)])
    }
}

/// One request's descriptors on `node`: its per-descriptor codes.
async fn call(node: &mut Running, ns: &str, d: Vec<RateLimitDescriptor>) -> Vec<i32> {
    codes(&ask(&mut node.grpc, ns, d, 0).await.expect("answer"))
}

async fn envoy_concurrency_holds_across_nodes(store: TestStore) {
    let nodes = nodes(&store, 0.2, 3).await;
    let clients: Vec<_> = nodes.iter().map(|n| n.grpc.clone()).collect();
    let held = Arc::new(AtomicU64::new(0));
    let (granted, denied) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let tasks: Vec<_> = (0..12)
        .map(|client| {
            let mut grpc = clients.clone();
            let (held, granted, denied) = (held.clone(), granted.clone(), denied.clone());
            tokio::spawn(async move {
                for round in 0..8 {
                    let start = (client + round) % 3;
                    let r = ask(&mut grpc[start], "inflight", vec![user("u1", false)], 0)
                        .await
                        .expect("start");
                    if r.overall_code == OVER {
                        denied.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    assert_eq!(r.overall_code, OK, "{r:?}");
                    granted.fetch_add(1, Ordering::SeqCst);
                    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= LIMIT, "{now} requests in flight past the limit");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    // ended on another node
                    held.fetch_sub(1, Ordering::SeqCst);
                    let end = (start + 1) % 3;
                    let r = ask(&mut grpc[end], "inflight", vec![user("u1", true)], 0)
                        .await
                        .expect("end");
                    assert_eq!(r.overall_code, OK, "an end is always OK: {r:?}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
    let (g, d) = (
        granted.load(Ordering::SeqCst),
        denied.load(Ordering::SeqCst),
    );
    println!(
        "{}: 12 clients × 8 requests over 3 nodes: {g} granted, {d} denied",
        store.store.kind()
    );
    assert_eq!(g + d, 96);
    assert!(g >= LIMIT && d > 0, "{g} granted, {d} denied");

    // every slot was ended: the whole limit is free, on any node, and no more
    let mut n = nodes;
    for i in 0..LIMIT as usize {
        assert_eq!(
            call(&mut n[i % 3], "inflight", vec![user("u1", false)]).await,
            vec![OK],
            "slot {i}"
        );
    }
    let full = ask(&mut n[1].grpc, "inflight", vec![user("u1", false)], 0)
        .await
        .expect("full");
    assert_eq!(full.overall_code, OVER);
    assert_eq!(full.statuses[0].limit_remaining, 0);
    assert_eq!(
        full.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(LIMIT as u32)
    );
    let names: Vec<&str> = full
        .response_headers_to_add
        .iter()
        .map(|h| h.key.as_str())
        .collect();
    assert_eq!(names, ["RateLimit-Policy", "RateLimit", "Retry-After"]);
    // one request's two descriptors: all or nothing (u1 is full, u2 keeps its slots)
    assert_eq!(
        call(
            &mut n[2],
            "inflight",
            vec![user("u2", false), user("u1", false)]
        )
        .await,
        vec![OK, OVER]
    );
    for i in 0..LIMIT as usize {
        assert_eq!(
            call(&mut n[i % 3], "inflight", vec![user("u2", false)]).await,
            vec![OK],
            "u2 untouched by the refused request: slot {i}"
        );
    }
    // an end with hits_addend 3 ends three slots at once; ending more than is held ends
    // what there is and changes no other key
    let mut three = user("u1", true);
    three.hits_addend = Some(UInt64Value { value: 3 });
    assert_eq!(call(&mut n[0], "inflight", vec![three]).await, vec![OK]);
    let mut again = user("u1", false);
    again.hits_addend = Some(UInt64Value { value: 3 });
    assert_eq!(call(&mut n[1], "inflight", vec![again]).await, vec![OK]);
    assert_eq!(
        call(&mut n[2], "inflight", vec![user("u1", false)]).await,
        vec![OVER]
    );
    let mut many = user("u1", true);
    many.hits_addend = Some(UInt64Value { value: 50 });
    assert_eq!(call(&mut n[2], "inflight", vec![many]).await, vec![OK]);
    let mut four = user("u1", false);
    four.hits_addend = Some(UInt64Value { value: 4 });
    assert_eq!(call(&mut n[0], "inflight", vec![four]).await, vec![OK]);
    assert_eq!(
        call(&mut n[0], "inflight", vec![user("u2", false)]).await,
        vec![OVER],
        "u2 still holds its four"
    );
    // more than the limit at once: over it, nothing taken
    let mut five = user("u3", false);
    five.hits_addend = Some(UInt64Value { value: 5 });
    assert_eq!(call(&mut n[0], "inflight", vec![five]).await, vec![OVER]);

    // slots never ended lapse after lease_ttl (1 s)
    for _ in 0..2 {
        assert_eq!(
            call(&mut n[0], "short", vec![user("gone", false)]).await,
            vec![OK]
        );
    }
    assert_eq!(
        call(&mut n[1], "short", vec![user("gone", false)]).await,
        vec![OVER]
    );
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    assert_eq!(
        call(&mut n[2], "short", vec![user("gone", false)]).await,
        vec![OK],
        "lapsed"
    );
    // on a namespace that limits hits, negative hits give hits back (Envoy's refill), as
    // /refund does: never below zero (the synchronous namespace is exact across nodes)
    for i in 0..5 {
        assert_eq!(
            call(&mut n[i % 3], "rates", vec![user("r1", false)]).await,
            vec![OK]
        );
    }
    let full = call(&mut n[1], "rates", vec![user("r1", false)]).await;
    assert_eq!(full, vec![OVER]);
    let mut back = user("r1", true);
    back.hits_addend = Some(UInt64Value { value: 2 });
    let r = ask(&mut n[2].grpc, "rates", vec![back], 0)
        .await
        .expect("refund");
    assert_eq!(codes(&r), vec![OK]);
    assert_eq!(r.statuses[0].limit_remaining, 2, "{r:?}");
    for node in &mut n[..2] {
        assert_eq!(call(node, "rates", vec![user("r1", false)]).await, vec![OK]);
    }
    assert_eq!(
        call(&mut n[2], "rates", vec![user("r1", false)]).await,
        vec![OVER]
    );
    let mut all = user("r1", true);
    all.hits_addend = Some(UInt64Value { value: u64::MAX });
    assert_eq!(call(&mut n[0], "rates", vec![all]).await, vec![OK]);
    for i in 0..5 {
        assert_eq!(
            call(&mut n[i % 3], "rates", vec![user("r1", false)]).await,
            vec![OK],
            "never below zero: 5 again, not more ({i})"
        );
    }
    assert_eq!(
        call(&mut n[0], "rates", vec![user("r1", false)]).await,
        vec![OVER]
    );
    for mut node in n {
        assert!(node.node.terminate());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_concurrency_on_sqlite() {
    envoy_concurrency_holds_across_nodes(TestStore::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_concurrency_on_postgres() {
    envoy_concurrency_holds_across_nodes(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_concurrency_on_redis() {
    envoy_concurrency_holds_across_nodes(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_concurrency_on_redis_cluster() {
    envoy_concurrency_holds_across_nodes(TestStore::redis_cluster()).await;
}

/// Python's grpcio with xds-protos, which has no `is_negative_hits` yet: the script sets
/// field 4 of the descriptor by its wire number, as a newer Envoy sends it, starting on
/// one node and ending on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_grpcio_client_ends_requests_with_negative_hits() {
    let store = TestStore::redis();
    let mut n = nodes(&store, 0.2, 2).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rls/concurrency.py");
    let ran = swin_testkit::python(
        script,
        n.iter()
            .map(|r| format!("127.0.0.1:{}", r.grpc_port))
            .collect::<Vec<_>>(),
    );
    let said = ran.said();
    assert!(ran.ok, "the Python client failed:\n{said}");
    assert!(said.contains("ok: all ended"), "{said}");
    for r in &mut n {
        assert!(r.node.terminate());
    }
}
