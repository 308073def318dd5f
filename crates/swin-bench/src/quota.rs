//! Envoy's rate limit quota service under many proxies: `streams` streams (one per
//! simulated proxy), each reporting `buckets` buckets (`{"name": "b<i>"}`) every
//! `interval`, as Envoy's filter does; counts the reports sent and the bucket actions
//! received. The node's CPU and memory are read around it (`scripts/bench-quota`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::google::protobuf;
use serde::Serialize;
use tonic::transport::Channel;

/// What to run.
#[derive(Debug, Clone)]
pub struct QuotaSpec {
    /// The node's gRPC address (host:port).
    pub target: String,
    /// The namespace (the reports' domain).
    pub namespace: String,
    /// Streams, one per simulated proxy.
    pub streams: usize,
    /// Buckets each stream reports.
    pub buckets: usize,
    /// How often each stream reports.
    pub interval: Duration,
    /// How long to run.
    pub duration: Duration,
}

/// What it measured.
#[derive(Debug, Serialize)]
pub struct QuotaResult {
    pub streams: usize,
    pub buckets: usize,
    pub seconds: f64,
    pub reports: u64,
    pub bucket_usages: u64,
    pub actions: u64,
    pub streams_ended: u64,
}

/// Streams one channel (one HTTP/2 connection) carries.
const STREAMS_PER_CHANNEL: usize = 100;

fn report(namespace: &str, buckets: usize, interval: Duration) -> RateLimitQuotaUsageReports {
    let usages = (0..buckets)
        .map(|i| BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("name".to_owned(), format!("b{i}"))].into_iter().collect(),
            }),
            time_elapsed: Some(protobuf::Duration {
                seconds: interval.as_secs() as i64,
                nanos: interval.subsec_nanos() as i32,
            }),
            num_requests_allowed: 5,
            num_requests_denied: 1,
        })
        .collect();
    RateLimitQuotaUsageReports {
        domain: namespace.to_owned(),
        bucket_quota_usages: usages,
    }
}

/// Runs `spec`; every stream reports until the duration is up, whatever the node says.
pub async fn run(spec: QuotaSpec) -> anyhow::Result<QuotaResult> {
    let channels = spec.streams.div_ceil(STREAMS_PER_CHANNEL).max(1);
    let mut conns = Vec::with_capacity(channels);
    for _ in 0..channels {
        let endpoint = Channel::from_shared(format!("http://{}", spec.target))?
            .connect_timeout(Duration::from_secs(5));
        conns.push(tokio::time::timeout(Duration::from_secs(10), endpoint.connect()).await??);
    }
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]);
    let start = Instant::now();
    let end = start + spec.duration;
    let tasks: Vec<_> = (0..spec.streams)
        .map(|i| {
            let channel = conns[i % channels].clone();
            let (spec, counts) = (spec.clone(), counts.clone());
            tokio::spawn(async move { proxy(channel, spec, end, counts).await })
        })
        .collect();
    let mut ended = 0;
    for t in tasks {
        if !matches!(t.await, Ok(Ok(()))) {
            ended += 1;
        }
    }
    let [reports, actions, usages] = &*counts;
    Ok(QuotaResult {
        streams: spec.streams,
        buckets: spec.buckets,
        seconds: start.elapsed().as_secs_f64(),
        reports: reports.load(Ordering::Relaxed),
        bucket_usages: usages.load(Ordering::Relaxed),
        actions: actions.load(Ordering::Relaxed),
        streams_ended: ended,
    })
}

/// One simulated proxy: a report every interval until `end`, reading every answer.
async fn proxy(
    channel: Channel,
    spec: QuotaSpec,
    end: Instant,
    counts: Arc<[AtomicU64; 3]>,
) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let reports =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|r| (r, rx)) });
    let mut answers = RateLimitQuotaServiceClient::new(channel)
        .stream_rate_limit_quotas(reports)
        .await?
        .into_inner();
    let reader_counts = counts.clone();
    let reader = tokio::spawn(async move {
        while let Ok(Some(a)) = answers.message().await {
            reader_counts[1].fetch_add(a.bucket_action.len() as u64, Ordering::Relaxed);
        }
    });
    let body = report(&spec.namespace, spec.buckets, spec.interval);
    // proxies start spread over one interval, as real ones do
    let offset = spec.interval.mul_f64(rand::random::<f64>());
    tokio::time::sleep(offset).await;
    let mut every = tokio::time::interval(spec.interval);
    while Instant::now() < end {
        every.tick().await;
        if tx.send(body.clone()).await.is_err() {
            anyhow::bail!("the stream ended");
        }
        counts[0].fetch_add(1, Ordering::Relaxed);
        counts[2].fetch_add(spec.buckets as u64, Ordering::Relaxed);
    }
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    Ok(())
}
