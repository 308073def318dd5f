//! The simulated nodes: each a real [`NamespaceSync`] over a store client of its own
//! (its own connections, as a node process has) and counters of its own, whose K keys
//! are hit once each per period, spread over it, and synced every period with
//! [`NamespaceSync::sync_once`]: the engine's own pushes (chunks of 500 windows, each
//! with its sequence number) and reads (of the held windows a push did not return).

use std::sync::Arc;
use std::time::Duration;

use swin_core::{CounterOptions, NamespaceCounters, WindowSize};
use swin_sync::store::{Access, PostgresStore, RedisStore};
use swin_sync::{NamespaceSync, PushId, Store, SyncMode};
use tokio::time::{Instant, MissedTickBehavior};

use super::{Spec, StoreKind};

/// The namespace every node syncs, with one window of this many seconds.
pub(super) const NAMESPACE: &str = "store-cost";
pub(super) const WINDOW_SECS: u32 = 60;
/// Keys of a Redis store start with this (the node's default is `swin`).
pub(super) const PREFIX: &str = "swin-cost";
/// A node's PostgreSQL pool, the node's default (`max_connections`).
const PG_POOL: u32 = 8;
/// Hits are sent in this many slices of the period.
const SLICES: u32 = 50;

/// One sync a node made: when it started (from the run's start) and what it did.
#[derive(Debug, Clone, Copy)]
pub(super) struct SyncRecord {
    pub(super) at: Duration,
    pub(super) ms: f64,
    pub(super) pushed: usize,
    pub(super) fetched: usize,
    pub(super) failed: bool,
}

/// A store client, as one node makes it from its config.
pub(super) fn store_for(spec: &Spec) -> anyhow::Result<Store> {
    Ok(match spec.store {
        StoreKind::Redis => Store::Redis(RedisStore::new(&spec.urls[0], PREFIX)?),
        StoreKind::RedisCluster => Store::Redis(RedisStore::cluster(
            &spec.urls,
            PREFIX,
            &Access::default(),
            0,
        )?),
        StoreKind::Postgres => Store::Postgres(PostgresStore::new(&spec.urls[0], PG_POOL)?),
    })
}

/// Node `i`'s engine over a store client of its own.
pub(super) fn engine(spec: &Spec, i: usize) -> anyhow::Result<Arc<NamespaceSync>> {
    let sizes = [WindowSize::new(WINDOW_SECS.into())?];
    let counters = Arc::new(NamespaceCounters::new(
        NAMESPACE,
        &sizes,
        CounterOptions::default(),
    ));
    Ok(Arc::new(NamespaceSync::new(
        counters,
        SyncMode::Periodic(spec.period),
        Some(store_for(spec)?),
        PushId::new(format!("cost-{}-{i}", std::process::id())),
        Duration::from_secs(30),
    )))
}

/// Hits each of the node's keys once per period, a slice of them every period/SLICES,
/// until `end`. Every node hits the same K keys (`k0`…), as nodes behind a round-robin
/// balancer all see a cluster's active keys.
pub(super) async fn hit(
    engine: Arc<NamespaceSync>,
    keys: Arc<Vec<String>>,
    period: Duration,
    end: Instant,
) {
    let slice = keys.len().div_ceil(SLICES as usize).max(1);
    let mut tick = tokio::time::interval(period / SLICES);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut next = 0;
    while Instant::now() < end {
        tick.tick().await;
        let now = swin_sync::now();
        for _ in 0..slice {
            let _ = engine
                .counters()
                .increment(&keys[next], WINDOW_SECS, 1.0, now);
            next = (next + 1) % keys.len();
        }
    }
}

/// Syncs every period from `first` until `end` (a sync that overruns its period skips
/// the ticks it missed, as the engine's loop does), recording each.
pub(super) async fn sync(
    engine: Arc<NamespaceSync>,
    period: Duration,
    started: Instant,
    first: Instant,
    end: Instant,
) -> Vec<SyncRecord> {
    let mut tick = tokio::time::interval_at(first, period);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut records = Vec::new();
    loop {
        let at = tick.tick().await;
        if at >= end {
            return records;
        }
        let t = Instant::now();
        let r = engine.sync_once(swin_sync::now()).await;
        records.push(SyncRecord {
            at: at - started,
            ms: t.elapsed().as_secs_f64() * 1e3,
            pushed: r.as_ref().map_or(0, |r| r.pushed),
            fetched: r.as_ref().map_or(0, |r| r.fetched),
            failed: r.is_err(),
        });
    }
}
