//! Envoy's rate limit quota service over three node processes, on Redis and on
//! PostgreSQL, with the Python stand-in for Envoy's filter (`quota.py`): proxies with
//! demands of 10/s, 50/s and 200/s on a 120/s limit, each on its own node, converge to
//! shares of 10, 50 and 60; every second admits at most 1.05 × the limit across all
//! proxies and, while demand exceeds it, at least 0.9 × the limit.

use serde_json::Value;
use swin_testkit::cluster::TestStore;

use super::{start_with, Running};

const LIMIT: f64 = 120.0;
const SECONDS: usize = 14;
/// Seconds given to converge: three reporting intervals and a sharing round.
const SETTLE: usize = 4;

fn config(store: &TestStore) -> String {
    format!(
        "{}
[[namespaces]]
name = \"edge\"
sync_rate = 0.2
store = \"main\"
window_sizes = [1, 60]
[[namespaces.descriptors]]
key = \"name\"
value = \"api\"
rate_limit = {{ unit = \"second\", requests_per_unit = {LIMIT} }}
",
        store.section()
    )
}

async fn nodes(store: &TestStore, n: usize) -> Vec<Running> {
    let mut out = Vec::new();
    for _ in 0..n {
        let dir = tempfile::tempdir().expect("dir");
        out.push(start_with(dir, &config(store)).await);
    }
    out
}

/// Runs the stand-in: one proxy per (node, demand); answers its JSON.
fn run_proxies(nodes: &[Running], demands: &[f64]) -> Value {
    let proxies: Vec<Value> = nodes
        .iter()
        .zip(demands)
        .map(|(n, d)| {
            serde_json::json!({"target": format!("127.0.0.1:{}", n.grpc_port), "demand": d})
        })
        .collect();
    let spec = serde_json::json!({
        "domain": "edge",
        "bucket": {"name": "api"},
        "interval": 1.0,
        "seconds": SECONDS,
        "proxies": proxies,
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/rls/quota.py");
    let ran = swin_testkit::python(script, [spec.to_string()]);
    assert!(ran.ok, "the stand-in failed:\n{}", ran.said());
    serde_json::from_str(&ran.stdout).expect("the stand-in's JSON")
}

fn per_second(out: &Value, proxy: usize) -> Vec<f64> {
    out["allowed"][proxy]
        .as_array()
        .expect("allowed")
        .iter()
        .map(|v| v.as_f64().expect("a count"))
        .collect()
}

async fn shares_converge_and_hold_the_limit(store: TestStore) {
    let mut nodes = nodes(&store, 3).await;
    let out = run_proxies(&nodes, &[10.0, 50.0, 200.0]);
    let each: Vec<Vec<f64>> = (0..3).map(|p| per_second(&out, p)).collect();
    // the last second is cut short by the run's end
    let settled = SETTLE..SECONDS - 1;
    for s in settled.clone() {
        let total: f64 = each.iter().map(|p| p[s]).sum();
        assert!(
            (LIMIT * 0.9..=LIMIT * 1.05).contains(&total),
            "second {s}: {total} admitted across the proxies, limit {LIMIT} ({each:?}; assignments {})",
            out["assignments"]
        );
    }
    let mean = |p: &Vec<f64>| p[settled.clone()].iter().sum::<f64>() / settled.len() as f64;
    let means: Vec<f64> = each.iter().map(mean).collect();
    let totals: Vec<f64> = (0..SECONDS)
        .map(|s| each.iter().map(|p| p[s]).sum())
        .collect();
    eprintln!("admitted per second across the proxies: {totals:?}; per proxy, settled: {means:?}");
    for (got, want) in means.iter().zip([10.0, 50.0, 60.0]) {
        assert!(
            (got - want).abs() <= want * 0.1 + 1.0,
            "shares {means:?}, want 10, 50, 60 (assignments {})",
            out["assignments"]
        );
    }
    for n in &mut nodes {
        assert!(n.node.terminate());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_converge_and_hold_the_limit_on_redis() {
    shares_converge_and_hold_the_limit(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shares_converge_and_hold_the_limit_on_postgres() {
    shares_converge_and_hold_the_limit(TestStore::postgres().await).await;
}
