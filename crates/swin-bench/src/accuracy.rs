//! Accuracy mode: one hot key incremented round robin over the nodes of a cluster, one
//! request at a time, so the true count at every answer is known exactly (every hit
//! acknowledged before it, plus itself). The divergence of an answer is the true count
//! minus the `current` count the node reported: how far that node's view lagged the
//! cluster.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use serde::Serialize;

#[derive(Debug, Clone)]
pub struct AccuracySpec {
    pub targets: Vec<String>,
    pub requests: u64,
    /// Requests per second over the cluster; `None` is as fast as answers come.
    pub rate: Option<f64>,
    pub namespace: String,
    pub key: String,
    pub window_size: u32,
}

#[derive(Debug, Serialize)]
pub struct AccuracyReport {
    pub requests: u64,
    pub seconds: f64,
    pub hits_per_sec: f64,
    /// True count minus reported count, over every answer.
    pub divergence_max: f64,
    pub divergence_p99: f64,
    pub divergence_p50: f64,
    pub divergence_mean: f64,
    /// Answers that reported more than the true count (should be none).
    pub over_reports: u64,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(target: &str) -> anyhow::Result<Sender> {
    let stream = tokio::net::TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

pub async fn run(spec: AccuracySpec) -> anyhow::Result<AccuracyReport> {
    anyhow::ensure!(!spec.targets.is_empty(), "need targets");
    let mut senders = Vec::new();
    for t in &spec.targets {
        senders.push(connect(t).await?);
    }
    let body = Bytes::from(format!("{{\"window_size\":{}}}", spec.window_size));
    let path = format!(
        "/v1/namespaces/{}/keys/{}/increment",
        spec.namespace, spec.key
    );
    let interval = spec.rate.map(|r| Duration::from_secs_f64(1.0 / r));
    let started = Instant::now();
    let mut acked: u64 = 0; // acknowledged hits in the current window
    let mut window: Option<i64> = None;
    let mut divergences = Vec::with_capacity(spec.requests as usize);
    let mut over = 0;
    for i in 0..spec.requests {
        if let Some(iv) = interval {
            tokio::time::sleep_until((started + iv * i as u32).into()).await;
        }
        let n = (i % senders.len() as u64) as usize;
        let req = Request::post(path.as_str())
            .header("host", spec.targets[n].as_str())
            .header("content-type", "application/json")
            .body(Full::new(body.clone()))?;
        senders[n].ready().await?;
        let resp = senders[n].send_request(req).await?;
        anyhow::ensure!(resp.status() == 200, "node answered {}", resp.status());
        let bytes = resp.into_body().collect().await?.to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&bytes)?;
        let w = &v["windows"][0];
        let start = w["window_start"].as_i64().unwrap_or_default();
        if window != Some(start) {
            // a new window: only hits from now on count in it
            window = Some(start);
            acked = 0;
        }
        acked += 1;
        let reported = w["current"].as_f64().unwrap_or_default();
        let d = acked as f64 - reported;
        if d < 0.0 {
            over += 1;
        }
        divergences.push(d);
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut sorted = divergences.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let q = |p: f64| sorted[((sorted.len() - 1) as f64 * p) as usize];
    Ok(AccuracyReport {
        requests: spec.requests,
        seconds,
        hits_per_sec: spec.requests as f64 / seconds,
        divergence_max: sorted.last().copied().unwrap_or(0.0),
        divergence_p99: q(0.99),
        divergence_p50: q(0.5),
        divergence_mean: divergences.iter().sum::<f64>() / divergences.len().max(1) as f64,
        over_reports: over,
    })
}
