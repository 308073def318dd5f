//! Envoy's rate limit service against real node processes, with a tonic client built
//! from Envoy's own protos (envoy-types): decisions and statuses per descriptor, the
//! envoyproxy/ratelimit rule features, bad requests, health, metrics, the counter keys
//! in the store, on each store, and a limit held across three nodes.
//!
//! Over 500 lines: one real node per scenario, and each scenario reads whole (its rules,
//! its requests, the answers and the store's counts side by side).

use std::path::Path;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use swin_testkit::cluster::{use_node_binary, Node, TestStore};
use tonic::transport::Channel;

mod compat;
mod concurrency;
mod quota;
mod replay;

/// envoyproxy/ratelimit's own example shape (its README), unchanged but for the domain.
const EDGE_YAML: &str = "\
domain: edge
descriptors:
  - key: generic_key
    value: login
    descriptors:
      - key: remote_address
        rate_limit:
          unit: minute
          requests_per_unit: 3
  - key: path
    value: /api/*
    rate_limit:
      unit: hour
      requests_per_unit: 2
  - key: user
    value: admin
    rate_limit:
      unlimited: true
  - key: user
    shadow_mode: true
    rate_limit:
      name: per_user
      unit: hour
      requests_per_unit: 1
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: vip
    rate_limit:
      name: vip
      unit: hour
      requests_per_unit: 100
      replaces:
        - name: per_user
";

struct Running {
    node: Node,
    grpc: RateLimitServiceClient<Channel>,
    grpc_port: u16,
    _dir: tempfile::TempDir,
}

async fn start(store: &TestStore, sync_rate: f64, extra: &str) -> Running {
    let dir = tempfile::tempdir().expect("dir");
    let yaml = dir.path().join("edge.yaml");
    std::fs::write(&yaml, EDGE_YAML).expect("yaml");
    let namespaces = format!(
        "store_timeout = 1\n{}\n[[namespaces]]\nname = \"edge\"\nsync_rate = {sync_rate}\nstore = \"main\"\ndescriptors_file = \"{}\"\n{extra}\n\n[[namespaces]]\nname = \"inline\"\nsync_rate = {sync_rate}\nstore = \"main\"\n[[namespaces.descriptors]]\nkey = \"api_key\"\nlimits = [{{ window_size = 90, limit = 2 }}]\n",
        store.section(),
        yaml.display()
    );
    start_with(dir, &namespaces).await
}

/// A node of `config` (without `grpc_listen`, which this adds) in `dir`, and a client.
async fn start_with(dir: tempfile::TempDir, config: &str) -> Running {
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let grpc_port = swin_testkit::free_port();
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        format!("grpc_listen = \"127.0.0.1:{grpc_port}\"\n{config}"),
    )
    .expect("config");
    let node = Node::spawn(Path::new(&path));
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let grpc = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    Running {
        node,
        grpc,
        grpc_port,
        _dir: dir,
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
    hits: u32,
) -> Result<RateLimitResponse, tonic::Status> {
    c.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: hits,
    })
    .await
    .map(tonic::Response::into_inner)
}

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

async fn the_service_answers_as_envoy_expects(store: TestStore) {
    let mut run = start(&store, 0.1, "").await;
    let c = &mut run.grpc;
    let login = |ip: &str| descriptor(&[("generic_key", "login"), ("remote_address", ip)]);
    // three per minute for each address, per descriptor status in order
    for i in 0..3 {
        let r = ask(
            c,
            "edge",
            vec![login("1.2.3.4"), descriptor(&[("nothing", "here")])],
            0,
        )
        .await
        .expect("answer");
        assert_eq!(r.overall_code, OK, "hit {i}");
        assert_eq!(codes(&r), vec![OK, OK]);
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().expect("a limit");
        assert_eq!((limit.requests_per_unit, limit.unit), (3, 2)); // MINUTE
        assert_eq!(s.limit_remaining, 2 - i);
        assert!(r.statuses[1].current_limit.is_none(), "no rule: no limit");
    }
    let r = ask(c, "edge", vec![login("1.2.3.4"), login("5.6.7.8")], 0)
        .await
        .expect("answer");
    assert_eq!(r.overall_code, OVER);
    assert_eq!(codes(&r), vec![OVER, OK]);
    let headers: Vec<(&str, &str)> = r
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    assert!(
        headers
            .iter()
            .any(|(k, v)| *k == "RateLimit-Policy" && v.contains("q=3;w=60")),
        "{headers:?}"
    );
    assert!(
        headers.iter().any(|(k, _)| *k == "RateLimit"),
        "{headers:?}"
    );
    assert!(
        headers.iter().any(|(k, _)| *k == "Retry-After"),
        "{headers:?}"
    );

    // hits_addend: the request's (0 counts as 1), and a descriptor's own
    let path = |p: &str| descriptor(&[("path", p)]);
    let r = ask(c, "edge", vec![path("/api/orders")], 2)
        .await
        .expect("answer");
    assert_eq!(codes(&r), vec![OK], "2 of 2 per hour, by prefix");
    let r = ask(c, "edge", vec![path("/api/other")], 0)
        .await
        .expect("answer");
    assert_eq!(
        codes(&r),
        vec![OK],
        "another path under the prefix is its own counter"
    );
    let mut heavy = path("/api/other");
    heavy.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 5 });
    let r = ask(c, "edge", vec![heavy], 0).await.expect("answer");
    assert_eq!(codes(&r), vec![OVER], "5 more than the 1 left");

    // unlimited: never limited, no limit reported
    for _ in 0..5 {
        let r = ask(c, "edge", vec![descriptor(&[("user", "admin")])], 0)
            .await
            .expect("answer");
        assert_eq!(
            (r.overall_code, r.statuses[0].current_limit.is_none()),
            (OK, true)
        );
    }
    // shadow mode: decided and counted, never denied
    for _ in 0..3 {
        let r = ask(c, "edge", vec![descriptor(&[("user", "bob")])], 0)
            .await
            .expect("answer");
        assert_eq!(r.overall_code, OK);
        assert_eq!(codes(&r), vec![OK]);
    }
    // replaces: beside a vip descriptor the per_user rule does not apply
    let r = ask(
        c,
        "edge",
        vec![
            descriptor(&[("user", "carol")]),
            descriptor(&[("vip", "carol")]),
        ],
        0,
    )
    .await
    .expect("answer");
    assert!(r.statuses[0].current_limit.is_none(), "replaced: {r:?}");
    assert_eq!(
        r.statuses[1]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(100)
    );

    // a descriptor's own limit override
    let mut own = descriptor(&[("anything", "x")]);
    own.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 1, // SECOND
    });
    assert_eq!(
        codes(&ask(c, "edge", vec![own.clone()], 0).await.expect("a")),
        vec![OK]
    );
    assert_eq!(
        codes(&ask(c, "edge", vec![own], 0).await.expect("a")),
        vec![OVER]
    );
    let mut none = descriptor(&[("anything", "y")]);
    none.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: 2,
    });
    assert_eq!(
        codes(&ask(c, "edge", vec![none], 0).await.expect("a")),
        vec![OVER]
    );
    // hostile values: every hit there is at once, a key with a NUL, an unknown unit
    let mut all = login("1.1.1.1");
    all.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: u64::MAX });
    assert_eq!(
        codes(&ask(c, "edge", vec![all], 0).await.expect("a")),
        vec![OVER]
    );
    // a NUL or a long value is a key of its own (an error would let Envoy's default
    // failure_mode_deny = false through)
    let r = ask(c, "edge", vec![login("1.1.1.1\0")], 0)
        .await
        .expect("a NUL is a key");
    assert_eq!(codes(&r), vec![OK]);
    let mut odd = descriptor(&[("anything", "z")]);
    odd.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 99,
    });
    let e = ask(c, "edge", vec![odd], 0)
        .await
        .expect_err("no such unit: a bad request");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("descriptors[0].limit.unit: 99"),
        "{e:?}"
    );

    // swin's own limits in a rule (a 90 s window), inline in the TOML
    let key = descriptor(&[("api_key", "k1")]);
    for expect in [OK, OK, OVER] {
        let r = ask(c, "inline", vec![key.clone()], 0)
            .await
            .expect("answer");
        assert_eq!(codes(&r), vec![expect]);
    }

    // an unknown domain and unmatched descriptors: OK, no limit
    let r = ask(c, "nowhere", vec![login("1.2.3.4")], 0)
        .await
        .expect("answer");
    assert_eq!(
        (r.overall_code, r.statuses[0].current_limit.is_none()),
        (OK, true)
    );

    // bad requests
    for (domain, descriptors) in [("", vec![login("1.2.3.4")]), ("edge", vec![])] {
        let e = ask(c, domain, descriptors, 0).await.expect_err("invalid");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }
    // an empty entry key is a key like any (no rule matches it): no error a client
    // could use to turn an answer into Envoy's failure_mode_deny = false
    let r = ask(c, "edge", vec![descriptor(&[("", "x")])], 0)
        .await
        .expect("an empty key");
    assert_eq!(codes(&r), vec![OK]);
    let huge = "x".repeat(5000);
    let e = ask(c, "edge", vec![descriptor(&[("generic_key", &huge)])], 0).await;
    assert!(
        e.is_ok_and(|r| r.overall_code == OK),
        "no rule for it: not counted"
    );

    // health, metrics, and the counters an operator finds in the store
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", run.grpc_port))
        .expect("uri")
        .connect()
        .await
        .expect("channel");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let h = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .expect("check")
        .into_inner();
    assert_eq!(
        h.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    let metrics = reqwest::get(format!("{}/metrics", run.node.base))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let series = |domain: &str, code: &str| {
        metrics.lines().any(|l| {
            l.starts_with("swin_rls_requests_total{")
                && l.contains(&format!("domain=\"{domain}\""))
                && l.contains(&format!("code=\"{code}\""))
        })
    };
    assert!(
        series("edge", "OVER_LIMIT") && series("edge", "OK"),
        "{metrics}"
    );
    assert!(
        series("unknown", "INVALID_ARGUMENT") && series("unknown", "OK"),
        "{metrics}"
    );
    // descriptors' decisions by rule: a rule's name, or the window of an unnamed one;
    // never a descriptor's value
    let decisions: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("swin_decisions_total{namespace=\"edge\""))
        .collect();
    for rule in ["rule=\"per_user\"", "rule=\"60s\""] {
        assert!(
            decisions.iter().any(|l| l.contains(rule)),
            "{rule}: {decisions:?}"
        );
    }
    assert!(
        decisions
            .iter()
            .all(|l| !l.contains("1.2.3.4") && !l.contains("bob")),
        "{decisions:?}"
    );
    assert!(run.node.terminate(), "clean stop");
    let totals = store.totals("edge").await;
    assert_eq!(
        totals.get("generic_key=login|remote_address=1.2.3.4"),
        Some(&3.0),
        "{totals:?}"
    );
    assert_eq!(
        totals.get("user=bob"),
        Some(&3.0),
        "shadow: every hit passes and counts, {totals:?}"
    );
    assert!(
        !totals.keys().any(|k| k.starts_with("user=admin")),
        "unlimited: never counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_on_sqlite() {
    the_service_answers_as_envoy_expects(TestStore::sqlite().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_on_postgres() {
    the_service_answers_as_envoy_expects(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rls_on_redis() {
    the_service_answers_as_envoy_expects(TestStore::redis()).await;
}

/// Python's grpcio with Envoy's own protos (xds-protos), a client nobody here wrote:
/// `client.py` runs its scenario against a node — decisions, rule features, bad
/// requests, health and server reflection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_grpcio_client_gets_what_envoy_expects() {
    let store = TestStore::sqlite().await;
    let mut run = start(&store, 0.1, "").await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rls/client.py");
    let ran = swin_testkit::python(script, [format!("127.0.0.1:{}", run.grpc_port)]);
    let said = ran.said();
    assert!(ran.ok, "the Python client failed:\n{said}");
    assert!(said.contains("ok: reflection has its file"), "{said}");
    assert!(
        said.contains("ok: reflection lists the quota service"),
        "{said}"
    );
    assert!(
        said.contains("ok: reflection shows is_negative_hits"),
        "{said}"
    );
    assert!(run.node.terminate());
}

/// Login hits from `address`, `n` of them spread over `nodes` in turn: how many were OK.
async fn allowed_round_robin(nodes: &mut [Running], address: &str, n: usize) -> usize {
    let mut allowed = 0;
    for i in 0..n {
        let at = i % nodes.len();
        let login = descriptor(&[("generic_key", "login"), ("remote_address", address)]);
        let r = ask(&mut nodes[at].grpc, "edge", vec![login], 0)
            .await
            .expect("answer");
        if r.overall_code == OK {
            allowed += 1;
        }
    }
    allowed
}

/// Three nodes in synchronous mode hold one gRPC limit for the cluster: clients spread
/// over them never get more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_hold_one_limit_in_synchronous_mode() {
    let store = TestStore::redis();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(start(&store, 0.0, "").await);
    }
    let allowed = allowed_round_robin(&mut nodes, "9.9.9.9", 12).await;
    assert_eq!(allowed, 3, "3 per minute across the cluster");
    for mut n in nodes {
        assert!(n.node.terminate());
    }
    assert_eq!(
        store
            .totals("edge")
            .await
            .get("generic_key=login|remote_address=9.9.9.9"),
        Some(&3.0)
    );
}

/// A descriptor file reloads with SIGHUP: the new limit applies, the counts stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_files_reload_with_sighup() {
    let store = TestStore::sqlite().await;
    let mut run = start(&store, 0.1, "").await;
    let path = run._dir.path().join("edge.yaml");
    let vip = || descriptor(&[("vip", "dan")]);
    let r = ask(&mut run.grpc, "edge", vec![vip()], 0)
        .await
        .expect("answer");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(100)
    );
    std::fs::write(
        &path,
        EDGE_YAML.replace("requests_per_unit: 100", "requests_per_unit: 1"),
    )
    .expect("rewrite");
    run.node.signal("HUP");
    let mut seen = None;
    for _ in 0..50 {
        let r = ask(&mut run.grpc, "edge", vec![vip()], 0)
            .await
            .expect("answer");
        seen = r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit);
        if seen == Some(1) {
            // the hit before the reload still counts: one of one is used
            assert_eq!(codes(&r), vec![OVER]);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, Some(1), "the reloaded rule applies");
    // a file that does not load leaves the running rules as they are
    std::fs::write(&path, "domain: edge\ndescriptors:\n  - key: \"\"\n").expect("rewrite");
    run.node.signal("HUP");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = ask(&mut run.grpc, "edge", vec![vip()], 0)
        .await
        .expect("answer");
    assert_eq!(
        r.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| l.requests_per_unit),
        Some(1)
    );
    assert!(run.node.terminate());
}

/// The same rules under strict admission, and GCRA buckets as rules: each decides over
/// gRPC exactly as over HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strict_admission_and_gcra_buckets_over_grpc() {
    let store = TestStore::postgres().await;
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(start(&store, 1.0, "admission = \"strict\"").await);
    }
    let allowed = allowed_round_robin(&mut nodes, "7.7.7.7", 12).await;
    assert_eq!(
        allowed, 3,
        "strict: 3 per minute across nodes that sync every second"
    );
    for mut n in nodes {
        assert!(n.node.terminate());
    }
    assert_eq!(
        store
            .totals("edge")
            .await
            .get("generic_key=login|remote_address=7.7.7.7"),
        Some(&3.0),
        "the store counts what was admitted, no quota left held"
    );

    let gcra = "algorithm = \"gcra\"\n[[namespaces.descriptors]]\nkey = \"bucket\"\nrate_limit = { unit = \"hour\", requests_per_unit = 2 }";
    let config = format!(
        "{}\n[[namespaces]]\nname = \"b\"\nsync_rate = 0.1\nstore = \"main\"\n{gcra}\n",
        store.section()
    );
    let mut run = start_with(tempfile::tempdir().expect("dir"), &config).await;
    let c = &mut run.grpc;
    let mut got = Vec::new();
    for _ in 0..3 {
        let r = ask(c, "b", vec![descriptor(&[("bucket", "x")])], 0)
            .await
            .expect("answer");
        got.push(r.overall_code);
    }
    assert_eq!(got, vec![OK, OK, OVER], "a burst of 2");
    assert!(run.node.terminate());
}
