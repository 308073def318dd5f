//! The store's CPU time, read before and after a run. Redis and Redis Cluster: `INFO
//! cpu`'s `used_cpu_sys + used_cpu_user` of every server (a cluster's servers are the
//! seed's `CLUSTER NODES`: primaries and replicas). PostgreSQL: the server's processes
//! in `/proc` (so on this machine only) — the postmaster's own and waited-for children's
//! time, and every live child's (backends, WAL writer, checkpointer, autovacuum) — found
//! from a backend's parent.

use std::time::Duration;

use swin_sync::store::PostgresStore;

use super::{Spec, StoreKind};

/// Where the store's CPU time is read.
#[derive(Debug)]
pub(super) enum StoreCpu {
    /// Redis servers (`redis://host:port`).
    Redis(Vec<String>),
    /// The postmaster's pid.
    Postgres(u32),
}

impl StoreCpu {
    /// Finds the store's servers or processes.
    pub(super) async fn find(spec: &Spec) -> anyhow::Result<StoreCpu> {
        Ok(match spec.store {
            StoreKind::Redis => StoreCpu::Redis(vec![spec.urls[0].clone()]),
            StoreKind::RedisCluster => StoreCpu::Redis(cluster_servers(&spec.urls[0]).await?),
            StoreKind::Postgres => {
                let store = PostgresStore::new(&spec.urls[0], 1)?;
                let (backend,): (i32,) = sqlx::query_as("SELECT pg_backend_pid()")
                    .fetch_one(store.pool())
                    .await?;
                let stat = proc_stat(u32::try_from(backend)?)?;
                StoreCpu::Postgres(stat.ppid)
            }
        })
    }

    /// How many servers or processes the reading covers.
    pub(super) fn servers(&self) -> usize {
        match self {
            StoreCpu::Redis(urls) => urls.len(),
            StoreCpu::Postgres(pid) => children(*pid).len() + 1,
        }
    }

    /// The store's CPU time so far (user + system).
    pub(super) async fn read(&self) -> anyhow::Result<Duration> {
        let mut secs = 0.0;
        match self {
            StoreCpu::Redis(urls) => {
                for url in urls {
                    secs += redis_cpu(url).await?;
                }
            }
            StoreCpu::Postgres(pid) => {
                let s = proc_stat(*pid)?;
                secs += s.own + s.children;
                for child in children(*pid) {
                    secs += proc_stat(child).map_or(0.0, |s| s.own);
                }
            }
        }
        Ok(Duration::from_secs_f64(secs))
    }
}

/// This process's CPU time so far (the simulated nodes' share of the machine).
pub(super) fn own() -> Duration {
    Duration::from_secs_f64(proc_stat(std::process::id()).map_or(0.0, |s| s.own))
}

async fn redis_cpu(url: &str) -> anyhow::Result<f64> {
    let mut con = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut con).await?;
    let field = |name: &str| -> f64 {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    Ok(field("used_cpu_sys:") + field("used_cpu_user:"))
}

/// Every server of the cluster `seed` belongs to, as `redis://host:port`.
async fn cluster_servers(seed: &str) -> anyhow::Result<Vec<String>> {
    let mut con = redis::Client::open(seed)?
        .get_multiplexed_async_connection()
        .await?;
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut con)
        .await?;
    Ok(nodes
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|addr| addr.split('@').next())
        .filter(|addr| !addr.starts_with(':'))
        .map(|addr| format!("redis://{addr}"))
        .collect())
}

/// What `/proc/<pid>/stat` says of a process: its parent, its own CPU seconds and its
/// waited-for children's.
struct ProcStat {
    ppid: u32,
    own: f64,
    children: f64,
}

fn proc_stat(pid: u32) -> anyhow::Result<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // after the command's closing parenthesis: state, ppid, …, utime (14th field of
    // the line), stime, cutime, cstime
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| anyhow::anyhow!("/proc/{pid}/stat: no command"))?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize| -> f64 { f.get(i).and_then(|v| v.parse().ok()).unwrap_or(0.0) };
    let tick = clock_ticks();
    Ok(ProcStat {
        ppid: num(1) as u32,
        own: (num(11) + num(12)) / tick,
        children: (num(13) + num(14)) / tick,
    })
}

/// The live children of `parent`.
fn children(parent: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| proc_stat(pid).is_ok_and(|s| s.ppid == parent))
        .collect()
}

/// Clock ticks per second of `/proc`'s times (`getconf CLK_TCK`, 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
