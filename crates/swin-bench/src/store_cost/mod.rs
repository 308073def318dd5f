//! `swin-bench store-cost`: what a cluster's syncs cost its store. N simulated nodes in
//! one process, each a real [`swin_sync::NamespaceSync`] with its own store client and
//! counters holding K active keys (one window of 60 s; each key hit once per period,
//! spread over it), syncing every period. Reports the syncs' durations, whether any
//! overran its period, and the store's CPU time over the run: its time per synced key
//! is that CPU over the windows pushed per second (one per key and sync).
//!
//! The syncs are the engine's (`sync_once`: its drain, its pushes in chunks with
//! sequence numbers, its reads), on the engine loop's timer (missed ticks skipped), but
//! not spaced: the engine's loop waits between a sync's store calls until half its
//! period has passed (`engine/pace.rs`), which adds up to a quarter of the period to a
//! long sync and nothing to the store's work. A node's first syncs (the warm-up) are
//! left out.

mod cpu;
mod floor;
mod nodes;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use self::cpu::StoreCpu;
use self::nodes::SyncRecord;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StoreKind {
    Redis,
    RedisCluster,
    Postgres,
}

#[derive(Debug, Clone)]
pub struct Spec {
    pub store: StoreKind,
    /// The store's URL (a Redis Cluster's seeds).
    pub urls: Vec<String>,
    pub nodes: usize,
    pub keys: usize,
    pub period: Duration,
    pub duration: Duration,
    pub warmup: Duration,
}

/// What a run measured (durations in ms, CPU in seconds per second of the run).
#[derive(Debug, Serialize)]
pub struct Report {
    pub store: StoreKind,
    pub nodes: usize,
    pub keys: usize,
    pub sync_rate: f64,
    pub seconds: f64,
    /// Syncs measured, and the ticks in the run (nodes × periods): fewer syncs than
    /// ticks means ticks were skipped behind a sync that overran.
    pub syncs: usize,
    pub ticks: usize,
    pub failed: usize,
    /// Syncs that took longer than the period.
    pub overran: usize,
    pub sync_p50_ms: f64,
    pub sync_p99_ms: f64,
    pub sync_max_ms: f64,
    /// Windows pushed per second (one per key and sync: the keys synced per second).
    pub synced_keys_per_sec: f64,
    /// Totals read back per second.
    pub fetched_per_sec: f64,
    /// How the store's CPU was read, and over how many servers or processes.
    pub cpu_source: &'static str,
    pub store_servers: usize,
    pub store_cpu_per_sec: f64,
    /// The store's CPU time per synced key, in microseconds.
    pub store_us_per_synced_key: f64,
    /// This process's CPU (the simulated nodes, on the same machine).
    pub nodes_cpu_per_sec: f64,
    /// The floor (see `floor`): the same windows pushed the plainest way, measured after
    /// swin's run on the same store (`None`: not measured for this store).
    pub floor_store_cpu_per_sec: Option<f64>,
    pub floor_synced_keys_per_sec: Option<f64>,
    pub floor_us_per_synced_key: Option<f64>,
    /// swin's store CPU per synced key ÷ the floor's.
    pub to_floor: Option<f64>,
}

/// Runs the nodes for the warm-up and the duration, and measures.
pub async fn run(spec: Spec) -> anyhow::Result<Report> {
    if spec.store == StoreKind::Postgres {
        nodes::store_for(&spec)?.migrate().await?;
    }
    let engines = (0..spec.nodes)
        .map(|i| nodes::engine(&spec, i))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let cpu = StoreCpu::find(&spec).await?;
    let keys: Arc<Vec<String>> = Arc::new((0..spec.keys).map(|k| format!("k{k}")).collect());
    let started = Instant::now();
    let from = started + spec.warmup;
    let end = from + spec.duration;
    let mut syncers = Vec::new();
    for (i, engine) in engines.iter().enumerate() {
        tokio::spawn(nodes::hit(engine.clone(), keys.clone(), spec.period, end));
        // nodes start at different times: their ticks spread over the period
        let first = started + spec.period.mul_f64(1.0 + i as f64 / spec.nodes as f64);
        let syncer = nodes::sync(engine.clone(), spec.period, started, first, end);
        syncers.push(tokio::spawn(syncer));
    }
    tokio::time::sleep_until(from).await;
    let (store0, own0) = (cpu.read().await?, cpu::own());
    tokio::time::sleep_until(end).await;
    let (store1, own1) = (cpu.read().await?, cpu::own());
    let mut records = Vec::new();
    for s in syncers {
        records.extend(s.await?.into_iter().filter(|r| r.at >= spec.warmup));
    }
    let secs = spec.duration.as_secs_f64();
    let mut report = summarize(&spec, &records);
    report.cpu_source = match cpu {
        StoreCpu::Redis(_) => "redis INFO cpu: used_cpu_sys + used_cpu_user",
        StoreCpu::Postgres(_) => "/proc: postmaster, its children and their reaped children",
    };
    report.store_servers = cpu.servers();
    report.store_cpu_per_sec = (store1 - store0).as_secs_f64() / secs;
    report.nodes_cpu_per_sec = (own1.saturating_sub(own0)).as_secs_f64() / secs;
    report.store_us_per_synced_key = if report.synced_keys_per_sec > 0.0 {
        report.store_cpu_per_sec / report.synced_keys_per_sec * 1e6
    } else {
        0.0
    };
    // the nodes' engines are done (their syncers returned): the floor has the store
    drop(engines);
    if let Some(f) = floor::run(&spec, &cpu).await? {
        report.floor_store_cpu_per_sec = Some(f.store_cpu_per_sec);
        report.floor_synced_keys_per_sec = Some(f.pushed_per_sec);
        report.floor_us_per_synced_key = Some(f.us_per_key);
        report.to_floor =
            (f.us_per_key > 0.0).then(|| report.store_us_per_synced_key / f.us_per_key);
    }
    Ok(report)
}

/// The syncs' figures; the CPU figures are filled in by the caller.
fn summarize(spec: &Spec, records: &[SyncRecord]) -> Report {
    let secs = spec.duration.as_secs_f64();
    let period_ms = spec.period.as_secs_f64() * 1e3;
    let mut ms: Vec<f64> = records.iter().map(|r| r.ms).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| -> f64 {
        if ms.is_empty() {
            return 0.0;
        }
        ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)]
    };
    let sum =
        |f: fn(&SyncRecord) -> usize| -> f64 { records.iter().map(f).sum::<usize>() as f64 / secs };
    Report {
        store: spec.store,
        nodes: spec.nodes,
        keys: spec.keys,
        sync_rate: spec.period.as_secs_f64(),
        seconds: secs,
        syncs: records.len(),
        ticks: (spec.nodes as f64 * secs / spec.period.as_secs_f64()).round() as usize,
        failed: records.iter().filter(|r| r.failed).count(),
        overran: ms.iter().filter(|&&m| m > period_ms).count(),
        sync_p50_ms: at(0.5),
        sync_p99_ms: at(0.99),
        sync_max_ms: ms.last().copied().unwrap_or(0.0),
        synced_keys_per_sec: sum(|r| r.pushed),
        fetched_per_sec: sum(|r| r.fetched),
        cpu_source: "",
        store_servers: 0,
        store_cpu_per_sec: 0.0,
        store_us_per_synced_key: 0.0,
        nodes_cpu_per_sec: 0.0,
        floor_store_cpu_per_sec: None,
        floor_synced_keys_per_sec: None,
        floor_us_per_synced_key: None,
        to_floor: None,
    }
}
