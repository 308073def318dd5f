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
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::UInt64Value;
use swin_testkit::cluster::TestStore;

use super::{ask, codes, descriptor, start_with, Running, OK, OVER};

const LIMIT: u64 = 4;

fn config(store: &TestStore, sync_rate: f64) -> String {
    // nodes sharing one SQLite file may wait for its write lock longer than
    // answer_timeout's half second on a loaded machine: this test is about exclusion,
    // so each call may wait its whole store_timeout
    format!(
        "store_timeout = 2\nanswer_timeout = 2\n{}
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

/// A concurrency namespace's rules, from a YAML file as envoyproxy/ratelimit writes
/// them: each rule's `requests_per_unit` slots in flight per key (not the namespace's
/// `limit`), a deeper rule its own, a value blocked, another unlimited (no slot), a
/// rule in shadow mode (slots taken past its limit, answered OK), a descriptor of no
/// rule (OK, no slot), and all or nothing across them — two nodes on one store.
async fn concurrency_rules_hold_across_nodes(store: TestStore) {
    const RULES: &str = "domain: gated
descriptors:
  - key: user
    rate_limit:
      requests_per_unit: 2
    descriptors:
      - key: model
        value: big
        rate_limit:
          requests_per_unit: 1
  - key: tenant
    value: free
    rate_limit:
      requests_per_unit: 0
  - key: tenant
    rate_limit:
      unlimited: true
  - key: canary
    shadow_mode: true
    rate_limit:
      name: canary
      requests_per_unit: 2
";
    let mut n = Vec::new();
    for _ in 0..2 {
        let dir = tempfile::tempdir().expect("dir");
        let yaml = dir.path().join("gated.yaml");
        std::fs::write(&yaml, RULES).expect("yaml");
        let config = format!(
            "{}
[[namespaces]]
name = \"gated\"
algorithm = \"concurrency\"
limit = 100
sync_rate = 0.2
store = \"main\"
descriptors_file = \"{}\"
",
            store.section(),
            yaml.display()
        );
        n.push(start_with(dir, &config).await);
    }
    let d = |entries: &[(&str, &str)], negative: bool| RateLimitDescriptor {
        is_negative_hits: negative,
        ..descriptor(entries)
    };
    let u1 = [("user", "u1")];
    let one = |r: &RateLimitResponse| {
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().map(|l| l.requests_per_unit);
        (s.code, limit, s.limit_remaining)
    };
    let (a, b) = n.split_at_mut(1);
    let (a, b) = (&mut a[0].grpc, &mut b[0].grpc);

    // the rule's 2, not the namespace's 100, across both nodes
    let r = ask(a, "gated", vec![d(&u1, false)], 0)
        .await
        .expect("answer");
    assert_eq!(one(&r), (OK, Some(2), 1));
    let r = ask(b, "gated", vec![d(&u1, false)], 0)
        .await
        .expect("answer");
    assert_eq!(one(&r), (OK, Some(2), 0));
    let r = ask(a, "gated", vec![d(&u1, false)], 0)
        .await
        .expect("answer");
    assert_eq!((r.overall_code, one(&r).0), (OVER, OVER), "{r:?}");
    // ended on B, free on A at once
    let r = ask(b, "gated", vec![d(&u1, true)], 0)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OK);
    let r = ask(a, "gated", vec![d(&u1, false)], 0)
        .await
        .expect("answer");
    assert_eq!(one(&r), (OK, Some(2), 0));

    // the deeper rule: its own 1 on its own key
    let big = [("user", "u2"), ("model", "big")];
    assert_eq!(
        codes(
            &ask(a, "gated", vec![d(&big, false)], 0)
                .await
                .expect("answer")
        ),
        vec![OK]
    );
    assert_eq!(
        codes(
            &ask(b, "gated", vec![d(&big, false)], 0)
                .await
                .expect("answer")
        ),
        vec![OVER]
    );
    assert_eq!(
        codes(
            &ask(b, "gated", vec![d(&[("user", "u2")], false)], 0)
                .await
                .expect("answer")
        ),
        vec![OK]
    );

    // blocked, unlimited, and no rule: no slot taken by any, however many
    for _ in 0..3 {
        let r = ask(a, "gated", vec![d(&[("tenant", "free")], false)], 0)
            .await
            .expect("answer");
        assert_eq!(one(&r), (OVER, Some(0), 0));
        let r = ask(a, "gated", vec![d(&[("tenant", "free")], true)], 0)
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OK);
        let r = ask(b, "gated", vec![d(&[("tenant", "paid")], false)], 0)
            .await
            .expect("answer");
        assert_eq!(
            (r.overall_code, r.statuses[0].limit_remaining),
            (OK, u32::MAX)
        );
        let r = ask(b, "gated", vec![d(&[("other", "x")], false)], 0)
            .await
            .expect("answer");
        assert_eq!(
            (r.overall_code, r.statuses[0].current_limit.clone()),
            (OK, None)
        );
    }

    // shadow mode: every start OK, each slot counted (what is left says so)
    let canary = [("canary", "c")];
    let mut left = Vec::new();
    for on_a in [true, false, true] {
        let node = if on_a { &mut *a } else { &mut *b };
        let r = ask(node, "gated", vec![d(&canary, false)], 0)
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OK, "{r:?}");
        assert_eq!(
            r.statuses[0]
                .current_limit
                .as_ref()
                .map(|l| l.name.as_str()),
            Some("canary")
        );
        left.push(r.statuses[0].limit_remaining);
    }
    assert_eq!(left, vec![1, 0, 0]);
    let r = ask(b, "gated", vec![d(&canary, true)], 3)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OK);
    let r = ask(a, "gated", vec![d(&canary, false)], 0)
        .await
        .expect("answer");
    assert_eq!(one(&r), (OK, Some(2), 1), "the three ended exactly");

    // all or nothing: a blocked descriptor beside a free one takes nothing
    let u3 = [("user", "u3")];
    let r = ask(
        a,
        "gated",
        vec![d(&u3, false), d(&[("tenant", "free")], false)],
        0,
    )
    .await
    .expect("answer");
    assert_eq!((r.overall_code, codes(&r)), (OVER, vec![OK, OVER]));
    for expect in [OK, OK, OVER] {
        assert_eq!(
            codes(
                &ask(b, "gated", vec![d(&u3, false)], 0)
                    .await
                    .expect("answer")
            ),
            vec![expect]
        );
    }
    for mut node in n {
        assert!(node.node.terminate());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_rules_on_redis() {
    concurrency_rules_hold_across_nodes(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_rules_on_postgres() {
    concurrency_rules_hold_across_nodes(TestStore::postgres().await).await;
}

/// `envoy_dynamic_metadata` on a concurrency namespace: the answer carries the domain,
/// the descriptors and the `metadata` of each rule whose descriptor took its slots — and
/// none of a rule whose descriptor is over its limit — as on a namespace of hits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamic_metadata_on_a_concurrency_namespace() {
    use envoy_types::pb::google::protobuf::value::Kind;
    const RULES: &str = "domain: gated
descriptors:
  - key: user
    rate_limit:
      requests_per_unit: 1
    metadata: { tier: gold }
";
    let dir = tempfile::tempdir().expect("dir");
    let yaml = dir.path().join("gated.yaml");
    std::fs::write(&yaml, RULES).expect("yaml");
    let config = format!(
        "[[namespaces]]
name = \"gated\"
algorithm = \"concurrency\"
limit = 100
sync_rate = -1
envoy_dynamic_metadata = true
descriptors_file = \"{}\"
",
        yaml.display()
    );
    let mut node = start_with(dir, &config).await;
    let tier = |r: &RateLimitResponse| {
        let m = r.dynamic_metadata.as_ref().expect("dynamic metadata");
        assert!(
            matches!(&m.fields["domain"].kind, Some(Kind::StringValue(d)) if d == "gated"),
            "{m:?}"
        );
        m.fields.get("metadata").map(|v| match &v.kind {
            Some(Kind::StructValue(s)) => format!("{:?}", s.fields["tier"].kind),
            other => panic!("metadata is not a map: {other:?}"),
        })
    };
    let r = ask(&mut node.grpc, "gated", vec![user("u1", false)], 0)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OK);
    assert_eq!(
        tier(&r).as_deref(),
        Some("Some(StringValue(\"gold\"))"),
        "{r:?}"
    );
    // over its limit: no rule's metadata
    let r = ask(&mut node.grpc, "gated", vec![user("u1", false)], 0)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!(tier(&r), None, "{r:?}");
    assert!(node.node.terminate());
}
