//! Redis Cluster under the operations people run it through, each on a six-process
//! cluster of its own (the conformance suite runs on the shared one): slots moved while
//! three engines push, and a primary killed while they push, with and without
//! `wait_replicas`. Every hit acknowledged is counted against what the store holds.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use swin_core::{CounterOptions, NamespaceCounters, UnixMs, WindowSize};
use swin_sync::{NamespaceSync, SyncMode};
use swin_testkit::redis_cluster::RedisCluster;
use swin_testkit::{wait_until, TestStore};

const KEYS: usize = 300;

/// Three engines on one store, each driven by a task counting hits over `KEYS` keys
/// until told to stop; every acknowledged hit is added to `hits`.
struct Load {
    engines: Vec<Arc<NamespaceSync>>,
    cancel: tokio_util::sync::CancellationToken,
    runs: Vec<tokio::task::JoinHandle<()>>,
    drivers: Vec<tokio::task::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
    hits: Arc<AtomicU64>,
}

impl Load {
    fn start(s: &TestStore) -> Load {
        let cancel = tokio_util::sync::CancellationToken::new();
        let stop = Arc::new(AtomicBool::new(false));
        let hits = Arc::new(AtomicU64::new(0));
        let (mut engines, mut runs, mut drivers) = (Vec::new(), Vec::new(), Vec::new());
        for n in 0..3 {
            let counters = Arc::new(NamespaceCounters::new(
                "api",
                &[WindowSize::new(3600).expect("size")],
                CounterOptions::default(),
            ));
            let engine = Arc::new(NamespaceSync::new(
                counters,
                SyncMode::Periodic(Duration::from_millis(50)),
                Some(s.store.clone()),
                format!("node-{n}").into(),
                Duration::from_secs(2),
            ));
            runs.push(tokio::spawn(engine.clone().run(cancel.clone())));
            let (e, stop, hits) = (engine.clone(), stop.clone(), hits.clone());
            drivers.push(tokio::spawn(async move {
                let mut i = n;
                while !stop.load(Ordering::Acquire) {
                    let now = UnixMs::from_system_time(std::time::SystemTime::now());
                    e.increment(&format!("k{}", i % KEYS), 3600, 1.0, now)
                        .await
                        .expect("every hit is answered, whatever the store does");
                    hits.fetch_add(1, Ordering::AcqRel);
                    i += 1;
                    if i % 20 == 0 {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }
            }));
            engines.push(engine);
        }
        Load {
            engines,
            cancel,
            runs,
            drivers,
            stop,
            hits,
        }
    }

    fn hits(&self) -> u64 {
        self.hits.load(Ordering::Acquire)
    }

    /// Stops the load, waits until every engine's diffs are confirmed, stops the
    /// engines; answers the hits made.
    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        for d in self.drivers {
            d.await.expect("driver");
        }
        let engines = self.engines.clone();
        wait_until(Duration::from_secs(60), "every diff confirmed", || {
            engines.iter().all(|e| {
                let s = e.status();
                s.pending_diffs == 0 && s.degraded.is_none()
            })
        })
        .await;
        self.cancel.cancel();
        for r in self.runs {
            r.await.expect("engine");
        }
        self.hits.load(Ordering::Acquire)
    }
}

async fn stored(s: &TestStore) -> f64 {
    s.totals("api").await.values().sum()
}

/// Slots move between primaries (keys and all, `redis-cli --cluster reshard`) three
/// times while three engines push: the pushes follow MOVED and ASK, retry TRYAGAIN, and
/// the store ends up holding every hit exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_moved_under_load_count_every_hit_once() {
    let cluster = RedisCluster::start();
    let s = TestStore::redis_cluster_at(&cluster.urls(), "swin", 0);
    let load = Load::start(&s);
    let p = cluster.primaries();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (from, to) in [(p[0], p[1]), (p[1], p[2]), (p[2], p[0])] {
        let c = &cluster;
        tokio::task::block_in_place(|| c.reshard(from, to, 3000));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let hits = load.finish().await;
    assert!(hits > 1_000, "too little load to tell: {hits}");
    assert_eq!(stored(&s).await, hits as f64);
}

/// Kills the primary of a shard whose replica lags (its link cut and the replica
/// paused, so what the primary takes meanwhile exists there alone), under load, lets
/// the replica take over and the killed node come back as its replica. Answers (hits
/// acknowledged, hits stored, hits made while the replica lagged).
async fn failover_under_load(wait_replicas: u32) -> (u64, f64, u64) {
    let mut cluster = RedisCluster::start();
    let s = TestStore::redis_cluster_at(&cluster.urls(), "swin", wait_replicas);
    let load = Load::start(&s);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let victim = cluster.primaries()[0];
    let replica = cluster.replica_of(victim);
    // the replica stops taking the primary's stream (paused, and its link cut: what
    // was sent before the cut still reaches it from its socket)
    cluster.signal(replica, "STOP");
    cluster.kill_replica_links(victim);
    let paused_at = load.hits();
    tokio::time::sleep(Duration::from_millis(700)).await;
    cluster.signal(victim, "KILL");
    let killed_at = load.hits();
    cluster.signal(replica, "CONT");
    let started = Instant::now();
    let c = &cluster;
    tokio::task::block_in_place(|| c.wait_for_primary(replica, Duration::from_secs(30)));
    eprintln!("replica promoted {:?} after the kill", started.elapsed());
    // the killed node comes back, as the new primary's replica (with wait_replicas, a
    // shard without one confirms nothing)
    cluster.restart(victim);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let hits = load.finish().await;
    (hits, stored(&s).await, killed_at - paused_at)
}

/// Without `wait_replicas`, a primary acknowledges pushes its replica never sees: they
/// are lost when the replica takes over. The loss is bounded by the hits made while
/// the replica lagged (and no hit is ever counted twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_at_most_what_the_replica_missed() {
    let (hits, stored, lagged) = failover_under_load(0).await;
    let lost = hits as f64 - stored;
    eprintln!("failover without wait_replicas: {lost} of {hits} hits lost ({lagged} made while the replica lagged)");
    assert!(stored <= hits as f64, "counted twice: {stored} > {hits}");
    assert!(
        lost <= lagged as f64,
        "lost {lost}, more than the {lagged} made meanwhile"
    );
    assert!(
        lost > 0.0,
        "the paused replica missed nothing: the scenario did not bite"
    );
}

/// With `wait_replicas = 1` a push counts as done only once the replica has it: the
/// pushes the lagging replica did not acknowledge are kept and pushed again after the
/// failover, and the store holds every hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_loses_nothing_when_pushes_wait_for_a_replica() {
    let (hits, stored, lagged) = failover_under_load(1).await;
    eprintln!("failover with wait_replicas = 1: {} of {hits} hits lost ({lagged} made while the replica lagged)", hits as f64 - stored);
    assert_eq!(stored, hits as f64);
}
