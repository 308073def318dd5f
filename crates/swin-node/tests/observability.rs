//! The dashboard and the alerts against a real Prometheus (Debian's, unpacked by
//! scripts/test) scraping a real node under load: every query of every panel of
//! `deploy/grafana/swin.json` is valid and returns data, and stopping the node's store
//! fires `SwinStoreUnreachable` from `deploy/prometheus/alerts.yml` (its `for:` cut to
//! a second, the rest as shipped).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use swin_testkit::cluster::{use_node_binary, within, Node};
use swin_testkit::ChildGuard;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// SWIN_PROMETHEUS (scripts/test sets it when it unpacks the server), the unpacked one,
/// or the one on PATH.
fn prometheus_binary() -> PathBuf {
    if let Ok(p) = std::env::var("SWIN_PROMETHEUS") {
        return p.into();
    }
    let unpacked = repo("target/tools/prometheus/usr/bin/prometheus");
    if unpacked.exists() {
        unpacked
    } else {
        "prometheus".into()
    }
}

fn node_config(redis_port: u16, grpc_port: u16) -> String {
    format!(
        "store_timeout = 1
grpc_listen = \"127.0.0.1:{grpc_port}\"
[stores.main]
kind = \"redis\"
url = \"redis://127.0.0.1:{redis_port}\"
prefix = \"obs\"

[[namespaces]]
name = \"api\"
window_sizes = [60]
sync_rate = 0.2
store = \"main\"
limits = [{{ window_size = 60, limit = 3 }}]

[[namespaces]]
name = \"trial\"
window_sizes = [60]
sync_rate = 0.2
store = \"main\"
shadow = true
limits = [{{ window_size = 60, limit = 3 }}]

[[namespaces]]
name = \"strict\"
window_sizes = [60]
sync_rate = 0.2
store = \"main\"
admission = \"strict\"
limits = [{{ window_size = 60, limit = 100 }}]

[[namespaces]]
name = \"slots\"
algorithm = \"concurrency\"
limit = 5
sync_rate = 0.2
store = \"main\"

[[namespaces]]
name = \"edge\"
sync_rate = -1
[[namespaces.descriptors]]
key = \"user\"
rate_limit = {{ unit = \"minute\", requests_per_unit = 2 }}
"
    )
}

/// Prometheus on `port`, scraping the node every second and evaluating `rules` every
/// second, its data under `dir`.
fn start_prometheus(dir: &Path, port: u16, node_port: u16, rules: &Path) -> ChildGuard {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - {}
scrape_configs:
  - job_name: swin
    static_configs:
      - targets: ['127.0.0.1:{node_port}']
",
            rules.display()
        ),
    )
    .expect("prometheus.yml");
    let child = Command::new(prometheus_binary())
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (scripts/test unpacks Debian's)");
    let guard = ChildGuard(child);
    swin_testkit::wait_for_port(port, Duration::from_secs(30));
    guard
}

/// An instant query's result series.
async fn query(c: &reqwest::Client, prom: &str, expr: &str) -> Vec<serde_json::Value> {
    let v: serde_json::Value = c
        .get(format!("{prom}/api/v1/query"))
        .query(&[("query", expr)])
        .send()
        .await
        .expect("query")
        .json()
        .await
        .expect("json");
    assert_eq!(v["status"], "success", "{expr}: {v}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Traffic of every kind the panels show: hits allowed and denied, strict hits, hits a
/// limit in shadow would deny, a lease held, an Envoy call.
async fn load(c: &reqwest::Client, base: &str, grpc_port: u16) {
    for ns in ["api", "strict", "trial"] {
        for _ in 0..5 {
            let r = c
                .post(format!("{base}/v1/namespaces/{ns}/keys/k/hit"))
                .send()
                .await
                .expect("hit");
            assert!(r.status() == 200 || r.status() == 429, "{}", r.status());
        }
    }
    let r = c
        .post(format!("{base}/v1/namespaces/slots/keys/k/acquire"))
        .send()
        .await
        .expect("acquire");
    // held until they lapse: once all 5 are, 429
    assert!(r.status() == 200 || r.status() == 429, "{}", r.status());
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let mut g = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("connect");
    g.should_rate_limit(RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "u".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    })
    .await
    .expect("ShouldRateLimit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_shows_every_panel_and_fires_an_alert_when_the_store_stops() {
    let dir = tempfile::tempdir().expect("dir");
    let redis_port = swin_testkit::free_port();
    let redis_dir = dir.path().join("redis");
    std::fs::create_dir_all(&redis_dir).expect("dir");
    let redis = swin_testkit::start_redis(redis_port, &redis_dir);
    let grpc_port = swin_testkit::free_port();
    let config = dir.path().join("swin.toml");
    std::fs::write(&config, node_config(redis_port, grpc_port)).expect("config");
    use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    let mut node = Node::spawn(&config);
    swin_testkit::wait_for_port(grpc_port, Duration::from_secs(30));

    // the alerts as shipped, each `for:` a second so that one fires within the test
    let alerts = std::fs::read_to_string(repo("deploy/prometheus/alerts.yml")).expect("alerts");
    let fast: String = alerts
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 1s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    let rules = dir.path().join("alerts.yml");
    std::fs::write(&rules, fast).expect("rules");
    let prom_port = swin_testkit::free_port();
    let prom_dir = dir.path().join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("dir");
    let _prometheus = start_prometheus(&prom_dir, prom_port, node.port, &rules);
    let prom = format!("http://127.0.0.1:{prom_port}");
    let c = reqwest::Client::new();

    // every panel's every query returns data once a few scrapes have seen the traffic
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo("deploy/grafana/swin.json")).expect("dashboard"),
    )
    .expect("json");
    let exprs: Vec<(String, String)> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |t| (title.clone(), t["expr"].as_str().expect("expr").to_owned()))
        })
        .collect();
    assert!(exprs.len() >= 16, "{exprs:?}");
    let mut missing = exprs.clone();
    within(
        Duration::from_secs(60),
        "every panel has data",
        async || {
            load(&c, &node.base, grpc_port).await;
            let mut still = Vec::new();
            for (title, expr) in &missing {
                if query(&c, &prom, expr).await.is_empty() {
                    still.push((title.clone(), expr.clone()));
                }
            }
            missing = still;
            if !missing.is_empty() {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            missing.is_empty()
        },
    )
    .await;

    // the store goes away: the namespaces on it are degraded, and the alert fires
    drop(redis);
    let took = within(
        Duration::from_secs(60),
        "SwinStoreUnreachable fires",
        async || {
            let v: serde_json::Value = c
                .get(format!("{prom}/api/v1/alerts"))
                .send()
                .await
                .expect("alerts")
                .json()
                .await
                .expect("json");
            v["data"]["alerts"].as_array().is_some_and(|a| {
                a.iter().any(|x| {
                    x["labels"]["alertname"] == "SwinStoreUnreachable"
                        && x["labels"]["namespace"] == "api"
                        && x["state"] == "firing"
                })
            })
        },
    )
    .await;
    println!("SwinStoreUnreachable fired {took:?} after the store stopped");
    assert!(node.terminate());
}
