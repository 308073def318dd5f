//! `swin-bench`: load a swin cluster (or the baseline) and print what it did.

mod accuracy;
mod baseline;
mod grpc;
mod keys;
mod load;
mod quota;
mod schedule;
mod spec;
mod store_cost;

use std::time::Duration;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "swin-bench",
    about = "Load generator and baseline server for swin"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// A bare axum server answering swin's increment routes with a constant JSON body.
    Baseline {
        #[arg(long, default_value = "127.0.0.1:7171")]
        listen: String,
    },
    /// Sends increments and reports requests/s, latency and statuses.
    Load {
        /// Node addresses (host:port), comma separated; round robin over connections.
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7070")]
        target: Vec<String>,
        #[arg(long, default_value_t = 32)]
        connections: usize,
        /// Seconds to run (default 10 unless --requests is given).
        #[arg(long)]
        duration: Option<f64>,
        /// Total requests to send, then stop.
        #[arg(long)]
        requests: Option<u64>,
        /// Open loop at this many requests/s over all connections (each latency from
        /// the time its request was due, so queueing counts); without it, closed loop.
        #[arg(long)]
        rate: Option<f64>,
        /// hot | uniform:K | zipf:K[:S]
        #[arg(long, default_value = "uniform:10000")]
        keys: String,
        #[arg(long, default_value = "default")]
        namespace: String,
        #[arg(long)]
        window_size: Option<u32>,
        /// Increments per request through /v1/increments.
        #[arg(long)]
        batch: Option<usize>,
        /// Ask for decisions (POST …/hit) instead of counting increments.
        #[arg(long, conflicts_with = "batch")]
        hit: bool,
        /// Acquire a concurrency lease and release it (a pair per request) instead.
        #[arg(long, conflicts_with_all = ["batch", "hit"])]
        lease: bool,
        /// Ask Envoy's rate limit service (gRPC) at the targets instead, the namespace
        /// as domain, one descriptor of these entries: `generic_key=api,user={key}`
        /// (`{key}`: the picked key).
        #[arg(long, conflicts_with_all = ["batch", "hit"])]
        grpc: Option<String>,
        /// Count the answers 200 per window of this many seconds of the wall clock
        /// (`admitted_per_window` in the JSON).
        #[arg(long)]
        windows: Option<u64>,
        /// Ask Limitador's `POST /check_and_report` (namespace, `{"key": KEY}`, delta 1)
        /// instead: a peer measured by the same tool.
        #[arg(long, conflicts_with_all = ["batch", "hit", "lease", "grpc"])]
        limitador: bool,
        /// Write each answer's due time (unix µs) and latency (µs) to FILE, a line
        /// each, to lay slow answers beside what the server did at the time.
        #[arg(long, value_name = "FILE")]
        latency_log: Option<std::path::PathBuf>,
        #[arg(long)]
        json: bool,
        #[arg(long)]
        progress: bool,
    },
    /// Envoy's rate limit quota service under many proxies: STREAMS streams, each
    /// reporting BUCKETS buckets (`{"name": "b<i>"}`) every interval.
    Quota {
        #[arg(long, default_value = "127.0.0.1:8081")]
        target: String,
        #[arg(long, default_value = "edge")]
        namespace: String,
        #[arg(long, default_value_t = 1000)]
        streams: usize,
        #[arg(long, default_value_t = 100)]
        buckets: usize,
        /// Seconds between a stream's reports.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Seconds to run.
        #[arg(long, default_value_t = 30.0)]
        duration: f64,
    },
    /// One hot key round robin over the nodes, one request at a time: how far each
    /// answer lags the true count.
    Accuracy {
        #[arg(long, value_delimiter = ',', required = true)]
        target: Vec<String>,
        #[arg(long, default_value_t = 5000)]
        requests: u64,
        /// Hits per second over the cluster; without it, as fast as answers come.
        #[arg(long)]
        rate: Option<f64>,
        #[arg(long, default_value = "default")]
        namespace: String,
        #[arg(long, default_value = "hot")]
        key: String,
        #[arg(long, default_value_t = 3600)]
        window_size: u32,
        #[arg(long)]
        json: bool,
    },
    /// What N nodes' syncs cost a store: N engines in this process, each with K active
    /// keys, syncing every period; their durations and the store's CPU per synced key.
    StoreCost {
        #[arg(long, value_enum)]
        store: store_cost::StoreKind,
        /// The store's URL; a Redis Cluster's seeds, comma separated.
        #[arg(long, value_delimiter = ',', required = true)]
        url: Vec<String>,
        #[arg(long, default_value_t = 10)]
        nodes: usize,
        #[arg(long, default_value_t = 1000)]
        keys: usize,
        /// Seconds between a node's syncs.
        #[arg(long, default_value_t = 1.0)]
        sync_rate: f64,
        /// Seconds measured, after the warm-up.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// Seconds run before measuring (a node's first sync creates its windows).
        #[arg(long, default_value_t = 3.0)]
        warmup: f64,
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
/// The command line, one arm per subcommand; hence its length.
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Baseline { listen } => baseline::serve(&listen).await,
        command @ Command::Accuracy { .. } => accuracy(command).await,
        command @ Command::Load { .. } => load(command).await,
        command @ Command::StoreCost { .. } => store_cost(command).await,
        Command::Quota {
            target,
            namespace,
            streams,
            buckets,
            interval,
            duration,
        } => {
            let r = quota::run(quota::QuotaSpec {
                target,
                namespace,
                streams,
                buckets,
                interval: std::time::Duration::from_secs_f64(interval),
                duration: std::time::Duration::from_secs_f64(duration),
            })
            .await?;
            println!("{}", serde_json::to_string(&r)?);
            Ok(())
        }
    }
}

/// `swin-bench accuracy`: runs it and prints what it measured.
async fn accuracy(command: Command) -> anyhow::Result<()> {
    let Command::Accuracy {
        target,
        requests,
        rate,
        namespace,
        key,
        window_size,
        json,
    } = command
    else {
        unreachable!("called for accuracy only")
    };
    let r = accuracy::run(accuracy::AccuracySpec {
        targets: target,
        requests,
        rate,
        namespace,
        key,
        window_size,
    })
    .await?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
                "hits {} in {:.1} s ({:.0}/s)   divergence: max {:.0}  p99 {:.0}  p50 {:.0}  mean {:.1}   over-reports {}",
                r.requests, r.seconds, r.hits_per_sec, r.divergence_max, r.divergence_p99, r.divergence_p50, r.divergence_mean, r.over_reports
            );
    }
    Ok(())
}

/// `swin-bench load`: runs it and prints what it measured.
async fn load(command: Command) -> anyhow::Result<()> {
    let Command::Load {
        target,
        connections,
        duration,
        requests,
        rate,
        keys,
        namespace,
        window_size,
        batch,
        hit,
        lease,
        grpc,
        windows,
        limitador,
        latency_log,
        json,
        progress,
    } = command
    else {
        unreachable!("called for load only")
    };
    let grpc = grpc.map(|d| parse_entries(&d)).transpose()?;
    let duration = match (duration, requests) {
        (Some(d), _) => Some(Duration::from_secs_f64(d)),
        (None, Some(_)) => None,
        (None, None) => Some(Duration::from_secs(10)),
    };
    let spec = spec::LoadSpec {
        targets: target,
        connections,
        duration,
        requests,
        rate,
        keys: keys::Keys::parse(&keys)?,
        namespace,
        window_size,
        batch,
        hit,
        lease,
        grpc,
        windows,
        limitador,
        latency_log,
        progress,
    };
    let r = load::run(spec).await?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "requests {:>10}   {:>10.0} req/s   {:>12.0} increments/s   {:.1} s",
            r.requests, r.requests_per_sec, r.increments_per_sec, r.seconds
        );
        println!(
            "latency ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            r.latency_ms.p50,
            r.latency_ms.p90,
            r.latency_ms.p99,
            r.latency_ms.p999,
            r.latency_ms.max
        );
        println!(
            "statuses {:?}   unanswered at the end {}   connection errors {}",
            r.statuses, r.unanswered, r.errors
        );
    }
    Ok(())
}

/// `swin-bench store-cost`: runs it and prints what it measured.
async fn store_cost(command: Command) -> anyhow::Result<()> {
    let Command::StoreCost {
        store,
        url,
        nodes,
        keys,
        sync_rate,
        duration,
        warmup,
        json,
    } = command
    else {
        unreachable!("called for store-cost only")
    };
    anyhow::ensure!(sync_rate > 0.0, "--sync-rate must be above 0");
    anyhow::ensure!(nodes > 0 && keys > 0, "--nodes and --keys must be above 0");
    let r = store_cost::run(store_cost::Spec {
        store,
        urls: url,
        nodes,
        keys,
        period: Duration::from_secs_f64(sync_rate),
        duration: Duration::from_secs_f64(duration),
        warmup: Duration::from_secs_f64(warmup),
    })
    .await?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "{:?} nodes {} keys {}: syncs {}/{} failed {} overran {}   sync ms p50 {:.1} p99 {:.1} max {:.1}",
            r.store, r.nodes, r.keys, r.syncs, r.ticks, r.failed, r.overran, r.sync_p50_ms, r.sync_p99_ms, r.sync_max_ms
        );
        println!(
            "synced keys/s {:.0}   store CPU {:.3} s/s over {} ({})   {:.2} us per synced key   nodes' CPU {:.3} s/s",
            r.synced_keys_per_sec, r.store_cpu_per_sec, r.store_servers, r.cpu_source, r.store_us_per_synced_key, r.nodes_cpu_per_sec
        );
        match (r.floor_us_per_synced_key, r.to_floor, r.floor_synced_keys_per_sec) {
            (Some(floor), Some(ratio), Some(keys)) => println!(
                "floor (plain pipeline, same keys and store): synced keys/s {keys:.0}   {floor:.2} us per synced key   swin / floor {ratio:.2}"
            ),
            _ => println!("floor: not measured for this store"),
        }
    }
    Ok(())
}

/// `k=v,k2=v2` as descriptor entries.
fn parse_entries(s: &str) -> anyhow::Result<Vec<(String, String)>> {
    s.split(',')
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .ok_or_else(|| anyhow::anyhow!("{kv:?} is not key=value"))
        })
        .collect()
}
