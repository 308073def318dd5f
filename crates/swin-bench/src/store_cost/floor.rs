//! The floor beside swin's figure: the same nodes' windows of the same keys pushed the
//! plainest way the store takes them, measured on the same store in the same run, so
//! that swin's cost per synced key reads as a ratio to it. Each simulated node, every
//! period (its ticks spread over the period as the engines' are), sends each key's diff
//! of 1 in chunks of [`CHUNK`]: on Redis one pipeline per chunk of `HINCRBY key window
//! 1` and `EXPIRE key 120` per key, no script, nothing read back (on a Redis Cluster,
//! one such pipeline per primary a chunk's keys live on, by `CLUSTER SLOTS`, sent
//! side by side); on PostgreSQL one
//! `INSERT … ON CONFLICT DO UPDATE` of the chunk's rows (a table of its own, dropped
//! after). No sequence numbers, no totals read back: what a sync does beyond this is
//! what the ratio prices.

use std::time::Duration;

use sqlx::PgPool;
use tokio::time::{Instant, MissedTickBehavior};

use super::cpu::StoreCpu;
use super::nodes::WINDOW_SECS;
use super::{Spec, StoreKind};

/// Keys per call, as the engine's chunks.
const CHUNK: usize = 500;
/// The floor's table on PostgreSQL.
const TABLE: &str = "swin_bench_floor";

/// What the floor measured.
#[derive(Debug, Clone, Copy)]
pub(super) struct Floor {
    pub(super) store_cpu_per_sec: f64,
    pub(super) pushed_per_sec: f64,
    pub(super) us_per_key: f64,
}

/// Where one node sends its floor pushes.
enum Client {
    Redis(redis::aio::MultiplexedConnection),
    /// A cluster's primaries, and which of them serves each slot range.
    Cluster(
        Vec<redis::aio::MultiplexedConnection>,
        Vec<(u16, u16, usize)>,
    ),
    Postgres(PgPool),
}

/// A connection to each primary of the cluster `seed` is in, and the slot ranges each
/// serves (`CLUSTER SLOTS`: start, end, then the primary's host and port first).
async fn cluster_client(seed: &str) -> anyhow::Result<Client> {
    let mut con = redis::Client::open(seed)?
        .get_multiplexed_async_connection()
        .await?;
    let slots: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Vec<redis::Value>>(&mut con)
        .await?
        .into_iter()
        .map(|range| {
            let parts: Vec<redis::Value> = redis::from_owned_redis_value(range)?;
            let mut parts = parts.into_iter();
            let start: u16 =
                redis::from_owned_redis_value(parts.next().unwrap_or(redis::Value::Nil))?;
            let end: u16 =
                redis::from_owned_redis_value(parts.next().unwrap_or(redis::Value::Nil))?;
            let primary: Vec<redis::Value> =
                redis::from_owned_redis_value(parts.next().unwrap_or(redis::Value::Nil))?;
            let mut primary = primary.into_iter();
            let host: String =
                redis::from_owned_redis_value(primary.next().unwrap_or(redis::Value::Nil))?;
            let port: u16 =
                redis::from_owned_redis_value(primary.next().unwrap_or(redis::Value::Nil))?;
            Ok((start, end, (host, port)))
        })
        .collect::<redis::RedisResult<_>>()?;
    let mut primaries: Vec<(String, u16)> = Vec::new();
    let mut conns = Vec::new();
    let mut ranges = Vec::new();
    for (start, end, addr) in slots {
        let i = match primaries.iter().position(|p| *p == addr) {
            Some(i) => i,
            None => {
                conns.push(
                    redis::Client::open(format!("redis://{}:{}", addr.0, addr.1))?
                        .get_multiplexed_async_connection()
                        .await?,
                );
                primaries.push(addr);
                primaries.len() - 1
            }
        };
        ranges.push((start, end, i));
    }
    Ok(Client::Cluster(conns, ranges))
}

/// The cluster slot of a key (CRC16/XMODEM of its hash tag, modulo 16384).
fn slot(key: &str) -> u16 {
    let tag = match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in tag.as_bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// Runs the floor for the warm-up and the duration on `spec`'s store.
pub(super) async fn run(spec: &Spec, cpu: &StoreCpu) -> anyhow::Result<Option<Floor>> {
    let mut clients = Vec::new();
    for _ in 0..spec.nodes {
        clients.push(match spec.store {
            StoreKind::Redis => Client::Redis(
                redis::Client::open(spec.urls[0].as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            StoreKind::Postgres => Client::Postgres(PgPool::connect(&spec.urls[0]).await?),
            StoreKind::RedisCluster => cluster_client(&spec.urls[0]).await?,
        });
    }
    if let Some(Client::Postgres(pool)) = clients.first() {
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {TABLE} (key text NOT NULL, window_start bigint NOT NULL, \
             count double precision NOT NULL, PRIMARY KEY (key, window_start))"
        ))
        .execute(pool)
        .await?;
    }
    let keys: Vec<String> = (0..spec.keys).map(|k| format!("k{k}")).collect();
    let started = Instant::now();
    let from = started + spec.warmup;
    let end = from + spec.duration;
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let first = started + spec.period.mul_f64(i as f64 / spec.nodes as f64);
        let keys = keys.clone();
        tasks.push(tokio::spawn(push(
            client,
            keys,
            spec.period,
            first,
            (from, end),
        )));
    }
    tokio::time::sleep_until(from).await;
    let cpu0 = cpu.read().await?;
    tokio::time::sleep_until(end).await;
    let cpu1 = cpu.read().await?;
    let mut pushed = 0;
    for t in tasks {
        pushed += t.await??;
    }
    if spec.store == StoreKind::Postgres {
        let pool = PgPool::connect(&spec.urls[0]).await?;
        sqlx::query(&format!("DROP TABLE IF EXISTS {TABLE}"))
            .execute(&pool)
            .await?;
    }
    let secs = spec.duration.as_secs_f64();
    let pushed_per_sec = pushed as f64 / secs;
    let store_cpu_per_sec = (cpu1 - cpu0).as_secs_f64() / secs;
    Ok(Some(Floor {
        store_cpu_per_sec,
        pushed_per_sec,
        us_per_key: match pushed_per_sec > 0.0 {
            true => store_cpu_per_sec / pushed_per_sec * 1e6,
            false => 0.0,
        },
    }))
}

/// One node's floor pushes, every period from `first` until `end`: how many windows
/// it pushed at ticks from `from` on (after the warm-up).
async fn push(
    mut client: Client,
    keys: Vec<String>,
    period: Duration,
    first: Instant,
    (from, end): (Instant, Instant),
) -> anyhow::Result<usize> {
    let mut tick = tokio::time::interval_at(first, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut pushed = 0;
    loop {
        let at = tick.tick().await;
        if at >= end {
            return Ok(pushed);
        }
        let counted = at >= from;
        let now = swin_sync::now().secs();
        let window = now - now.rem_euclid(i64::from(WINDOW_SECS));
        for chunk in keys.chunks(CHUNK) {
            match &mut client {
                Client::Redis(con) => {
                    let mut pipe = redis::pipe();
                    for key in chunk {
                        let name = format!("swin-floor:{{{key}}}:{WINDOW_SECS}");
                        pipe.cmd("HINCRBY").arg(&name).arg(window).arg(1).ignore();
                        pipe.cmd("EXPIRE").arg(&name).arg(120).ignore();
                    }
                    pipe.query_async::<()>(con).await?;
                }
                Client::Cluster(conns, ranges) => {
                    let mut pipes: Vec<redis::Pipeline> = vec![redis::pipe(); conns.len()];
                    for key in chunk {
                        let name = format!("swin-floor:{{{key}}}:{WINDOW_SECS}");
                        let s = slot(&name);
                        let Some(&(_, _, i)) = ranges.iter().find(|r| r.0 <= s && s <= r.1) else {
                            anyhow::bail!("slot {s} of {name}: no primary serves it");
                        };
                        pipes[i]
                            .cmd("HINCRBY")
                            .arg(&name)
                            .arg(window)
                            .arg(1)
                            .ignore();
                        pipes[i].cmd("EXPIRE").arg(&name).arg(120).ignore();
                    }
                    let sends = conns.iter().zip(&pipes).map(|(con, pipe)| {
                        let mut con = con.clone();
                        async move { pipe.query_async::<()>(&mut con).await }
                    });
                    for sent in futures_util::future::join_all(sends).await {
                        sent?;
                    }
                }
                Client::Postgres(pool) => {
                    let starts = vec![window; chunk.len()];
                    let counts = vec![1.0f64; chunk.len()];
                    sqlx::query(&format!(
                        "INSERT INTO {TABLE} (key, window_start, count) \
                         SELECT * FROM unnest($1::text[], $2::bigint[], $3::float8[]) \
                         ON CONFLICT (key, window_start) DO UPDATE \
                         SET count = {TABLE}.count + excluded.count"
                    ))
                    .bind(chunk)
                    .bind(&starts)
                    .bind(&counts)
                    .execute(&*pool)
                    .await?;
                }
            }
            if counted {
                pushed += chunk.len();
            }
        }
    }
}
