//! Traces over OTLP (`[telemetry]`) received by a real OTLP/gRPC receiver
//! (`tests/otlp/receiver.py`: OpenTelemetry's published protos served by grpcio, in the
//! virtual environment scripts/test keeps): a span per request on both doors, named by
//! route or method, with the namespace and the decision, and the store calls it made as
//! its children, joining the caller's trace when it sent a `traceparent`; a node whose
//! `sample_ratio` is 0 sends none of its own.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use swin_testkit::cluster::{use_node_binary, Node, TestStore};
use swin_testkit::ChildGuard;

/// One span as the receiver printed it.
#[derive(Debug, Clone, serde::Deserialize)]
struct Span {
    service: Option<String>,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    attributes: serde_json::Map<String, serde_json::Value>,
}

impl Span {
    fn attr(&self, key: &str) -> &serde_json::Value {
        self.attributes.get(key).unwrap_or(&serde_json::Value::Null)
    }
}

/// The receiver on `port`, printing spans into `out`.
fn receiver(port: u16, out: &Path) -> ChildGuard {
    let python = std::env::var("SWIN_PYTHON").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../target/tools/venv/bin/python"
        )
        .into()
    });
    let child = Command::new(python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/otlp/receiver.py"
        ))
        .arg(port.to_string())
        .stdout(std::fs::File::create(out).expect("spans file"))
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python with opentelemetry-proto (scripts/test makes the venv)");
    let guard = ChildGuard(child);
    swin_testkit::wait_for_port(port, Duration::from_secs(30));
    guard
}

fn spans(out: &Path) -> Vec<Span> {
    let file = std::fs::File::open(out).expect("spans file");
    BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

fn config(store: &TestStore, otlp_port: u16, grpc_port: u16, service: &str, ratio: f64) -> String {
    format!(
        "store_timeout = 2
grpc_listen = \"127.0.0.1:{grpc_port}\"
{}
[telemetry]
otlp_endpoint = \"http://127.0.0.1:{otlp_port}\"
service_name = \"{service}\"
sample_ratio = {ratio}

[[namespaces]]
name = \"api\"
window_sizes = [60]
sync_rate = 0
store = \"main\"
limits = [{{ window_size = 60, limit = 1 }}]

[[namespaces]]
name = \"edge\"
sync_rate = 0
store = \"main\"
[[namespaces.descriptors]]
key = \"user\"
rate_limit = {{ unit = \"minute\", requests_per_unit = 5 }}
",
        store.section()
    )
}

/// A caller's trace context: the trace and the caller's span the node's spans join.
const HTTP_PARENT: (&str, &str) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
const GRPC_PARENT: (&str, &str) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
const QUOTA_PARENT: (&str, &str) = ("5b8aa5a2d2c872e8321cf37308d69df2", "051581bf3cb55c13");

fn traceparent((trace, span): (&str, &str)) -> String {
    format!("00-{trace}-{span}-01")
}

/// Two hits of `key` on `api` (allowed, denied) and an Envoy call on `edge`, then a stop
/// (which exports what is left); with `joined`, the allowed hit and the Envoy call carry
/// a caller's `traceparent`.
async fn traffic(config: &Path, grpc_port: u16, key: &str, joined: bool) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let mut node = Node::spawn(config);
    let c = reqwest::Client::new();
    for want in [200, 429] {
        let mut req = c.post(format!("{}/v1/namespaces/api/keys/{key}/hit", node.base));
        if joined && want == 200 {
            req = req.header("traceparent", traceparent(HTTP_PARENT));
        }
        let r = req.send().await.expect("hit");
        assert_eq!(r.status(), want);
    }
    // a caller's context that is no context leaves the span a root, the request answered
    for odd in [
        "00-zz-yy-01",
        "00-00000000000000000000000000000000-0000000000000000-01",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736",
    ] {
        let r = c
            .get(format!("{}/healthz", node.base))
            .header("traceparent", odd)
            .send()
            .await
            .expect("healthz");
        assert_eq!(r.status(), 200, "{odd:?}");
    }
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));
    let mut g = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    let mut call = tonic::Request::new(RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    });
    if joined {
        let parent = traceparent(GRPC_PARENT).parse().expect("metadata");
        call.metadata_mut().insert("traceparent", parent);
    }
    g.should_rate_limit(call).await.expect("ShouldRateLimit");
    if joined {
        quota_report(grpc_port).await;
    }
    assert!(node.terminate(), "a clean stop");
}

/// One report on Envoy's quota service (bucket `user=bob` of `edge`, 3 allowed) in the
/// caller's trace [`QUOTA_PARENT`]; waits for its assignment.
async fn quota_report(grpc_port: u16) {
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
    use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
        BucketId, RateLimitQuotaUsageReports,
    };
    let report = RateLimitQuotaUsageReports {
        domain: "edge".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("user".to_owned(), "bob".to_owned())]
                    .into_iter()
                    .collect(),
            }),
            time_elapsed: None,
            num_requests_allowed: 3,
            num_requests_denied: 0,
        }],
    };
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(report).await.expect("queued");
    let reports =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut call = tonic::Request::new(reports);
    let parent = traceparent(QUOTA_PARENT).parse().expect("metadata");
    call.metadata_mut().insert("traceparent", parent);
    let mut answers = RateLimitQuotaServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect")
        .stream_rate_limit_quotas(call)
        .await
        .expect("stream")
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), answers.message()).await;
    assert!(matches!(first, Ok(Ok(Some(_)))), "an assignment: {first:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_their_store_calls_reach_an_otlp_receiver() {
    let dir = tempfile::tempdir().expect("dir");
    let otlp_port = swin_testkit::free_port();
    let out = dir.path().join("spans.jsonl");
    let _receiver = receiver(otlp_port, &out);
    let store = TestStore::redis();

    // sampled out: a node at 0 sends nothing
    let path = dir.path().join("unsampled.toml");
    let grpc_port = swin_testkit::free_port();
    std::fs::write(
        &path,
        config(&store, otlp_port, grpc_port, "swin-unsampled", 0.0),
    )
    .expect("config");
    traffic(&path, grpc_port, "unsampled", false).await;

    let path = dir.path().join("traced.toml");
    let grpc_port = swin_testkit::free_port();
    std::fs::write(
        &path,
        config(&store, otlp_port, grpc_port, "swin-traced", 1.0),
    )
    .expect("config");
    traffic(&path, grpc_port, "traced", true).await;

    // the stop exported them; the receiver prints as it receives
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut all = spans(&out);
    let hit = "POST /v1/namespaces/{namespace}/keys/{key}/hit";
    while all.iter().filter(|s| s.name == hit).count() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        all = spans(&out);
    }
    assert!(
        all.iter()
            .all(|s| s.service.as_deref() == Some("swin-traced")),
        "only the sampled node's spans: {all:#?}"
    );
    let children = |parent: &Span| -> Vec<Span> {
        all.iter()
            .filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id)
            .cloned()
            .collect()
    };

    let hits: Vec<&Span> = all.iter().filter(|s| s.name == hit).collect();
    assert_eq!(hits.len(), 2, "{all:#?}");
    let decided: Vec<(&serde_json::Value, &serde_json::Value, &serde_json::Value)> = hits
        .iter()
        .map(|s| {
            (
                s.attr("namespace"),
                s.attr("decision"),
                s.attr("http.response.status_code"),
            )
        })
        .collect();
    for want in [("allowed", 200), ("denied", 429)] {
        assert!(
            decided
                .iter()
                .any(|(n, d, c)| *n == "api" && *d == want.0 && **c == want.1),
            "{want:?}: {decided:?}"
        );
    }
    for s in &hits {
        // the allowed hit joined its caller's trace; the denied one is a root
        let parent = match s.attr("decision").as_str() {
            Some("allowed") => HTTP_PARENT,
            _ => (s.trace_id.as_str(), ""),
        };
        assert_eq!(
            (s.trace_id.as_str(), s.parent_span_id.as_str()),
            parent,
            "{s:?}"
        );
        assert_eq!(
            s.attr("http.route"),
            "/v1/namespaces/{namespace}/keys/{key}/hit"
        );
        // synchronous: the hit went to the store while the request waited
        let store_calls = children(s);
        assert!(
            store_calls.iter().any(|c| c.name == "push"
                && c.attr("db.system.name") == "redis"
                && c.attr("db.namespace") == "api"),
            "{s:?}: {store_calls:#?}"
        );
    }

    let rls: Vec<&Span> = all
        .iter()
        .filter(|s| s.name == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
        .collect();
    assert_eq!(rls.len(), 1, "{all:#?}");
    let rls = rls[0];
    assert_eq!(
        (
            rls.attr("namespace"),
            rls.attr("decision"),
            rls.attr("envoy.overall_code")
        ),
        (&"edge".into(), &"allowed".into(), &"OK".into())
    );
    assert_eq!(
        (rls.trace_id.as_str(), rls.parent_span_id.as_str()),
        GRPC_PARENT,
        "Envoy's call joined its caller's trace"
    );
    assert!(
        children(rls)
            .iter()
            .any(|c| c.name == "push" && c.attr("db.namespace") == "edge"),
        "{rls:?}: {all:#?}"
    );

    // a report of Envoy's quota service: its span joins the stream's caller, and the
    // allowed requests it counts went to the store under it (synchronous)
    let quota: Vec<&Span> = all
        .iter()
        .filter(|s| {
            s.name
                == "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas"
        })
        .collect();
    assert_eq!(quota.len(), 1, "{all:#?}");
    let quota = quota[0];
    assert_eq!(quota.attr("namespace"), &serde_json::Value::from("edge"));
    assert_eq!(
        (quota.trace_id.as_str(), quota.parent_span_id.as_str()),
        QUOTA_PARENT,
        "the report joined its caller's trace"
    );
    assert!(
        children(quota)
            .iter()
            .any(|c| c.name == "push" && c.attr("db.namespace") == "edge"),
        "{quota:?}: {all:#?}"
    );
}
