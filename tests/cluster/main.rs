//! Cluster acceptance: real swin-node processes behind a real nginx, on real stores
//! (Redis Cluster among them: the six-process cluster this test process shares),
//! under faults (store outage, node crash and stop, node join, a slow store).
//!
//! Built as a test target of the swin-node package (see its Cargo.toml), so that Cargo
//! builds the node binary before running these.
//!
//! Each scenario runs whole, with its own cluster: `faults` (outages, crashes, joins,
//! slow stores) and `limits` (decisions across nodes); the harness is
//! `swin_testkit::cluster`, what the scenarios share is here.

mod faults;
mod limits;

use faults::*;
use limits::*;
use std::collections::BTreeMap;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use std::sync::{Arc, Mutex};

use std::time::{Duration, Instant};

use swin_testkit::cluster::{
    increment, increment_batch, read, within, Cluster, ClusterStore, DelayProxy, TestStore as Store,
};

use swin_testkit::{EphemeralPostgres, TestDatabase};

const PERIOD: Duration = Duration::from_millis(100);

/// One scenario at a time: each runs several nodes, nginx and a store on 2 cores, and
/// the timings they check (three sync periods, one sync period) are about the cluster,
/// not about how many other clusters share the machine.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What every scenario does first: takes its turn, and points the harness at the node
/// binary Cargo built for this test.
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    let turn = SERIAL.lock().await;
    swin_testkit::cluster::use_node_binary(env!("CARGO_BIN_EXE_swin-node"));
    turn
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}

/// Reads every key on every node (three readers per node at once); with `expect`,
/// returns the reads that differ from it.
async fn wrong_counts(
    c: &reqwest::Client,
    cluster: &Cluster,
    keys: &[String],
    expect: Option<f64>,
) -> Vec<(String, String, f64)> {
    let mut tasks = Vec::new();
    for node in cluster.running() {
        for part in keys.chunks(keys.len().div_ceil(3)) {
            let (c, base, part) = (c.clone(), node.base.clone(), part.to_vec());
            tasks.push(tokio::spawn(async move {
                let mut wrong = Vec::new();
                for k in part {
                    let n = read(&c, &base, "api", &k).await;
                    let got = n.current + n.previous;
                    if expect.is_some_and(|e| e != got) {
                        wrong.push((base.clone(), k, got));
                    }
                }
                wrong
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("reader"));
    }
    all
}

/// Hits through nginx until told to stop; counts acknowledged hits per key and every
/// status seen.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<BTreeMap<String, f64>>>,
    statuses: Arc<Mutex<BTreeMap<u16, u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(base: &str, workers: usize, keys: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(BTreeMap::new()));
        let statuses = Arc::new(Mutex::new(BTreeMap::new()));
        let c = client();
        let tasks = (0..workers)
            .map(|w| {
                let (stop, acked, statuses, c, base) = (
                    stop.clone(),
                    acked.clone(),
                    statuses.clone(),
                    c.clone(),
                    base.to_owned(),
                );
                tokio::spawn(async move {
                    let mut i = w;
                    while !stop.load(Ordering::Relaxed) {
                        let key = format!("k{}", i % keys);
                        i += workers;
                        match increment(&c, &base, "api", &key).await {
                            Some((status, _)) => {
                                *statuses.lock().expect("lock").entry(status).or_default() += 1;
                                if status == 200 {
                                    *acked.lock().expect("lock").entry(key).or_default() += 1.0;
                                }
                            }
                            None => *statuses.lock().expect("lock").entry(0).or_default() += 1,
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            acked,
            statuses,
            tasks,
        }
    }

    async fn finish(self) -> (BTreeMap<String, f64>, BTreeMap<u16, u64>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("load task");
        }
        let acked = self.acked.lock().expect("lock").clone();
        let statuses = self.statuses.lock().expect("lock").clone();
        (acked, statuses)
    }
}

async fn all_ready(c: &reqwest::Client, cluster: &Cluster) -> bool {
    for n in cluster.running() {
        let Ok(r) = c.get(format!("{}/v1/namespaces", n.base)).send().await else {
            return false;
        };
        let v: serde_json::Value = r.json().await.unwrap_or_default();
        let ns = &v["namespaces"][0];
        if ns["degraded"] != false || ns["pending_diffs"] != 0 {
            return false;
        }
    }
    true
}

async fn degraded_everywhere(c: &reqwest::Client, cluster: &Cluster) -> bool {
    for n in cluster.running() {
        let r = c
            .get(format!("{}/readyz", n.base))
            .send()
            .await
            .expect("readyz");
        if r.status() != 503 {
            return false;
        }
        let v: serde_json::Value = r.json().await.expect("json");
        if v["status"] != "degraded" {
            return false;
        }
    }
    true
}

/// `host:port` of a store URL (`scheme://[user@]host:port[/path]`).
fn host_port(url: &str) -> String {
    let rest = url.split("://").nth(1).expect("scheme://");
    let rest = rest.rsplit('@').next().expect("host");
    rest.split('/').next().expect("host:port").to_owned()
}

/// `clients` clients each send `each` hits on key `door` through the load balancer, at
/// once; how many were allowed (every denial has a Retry-After).
async fn hits_on_door(lb: &str, clients: usize, each: usize) -> u64 {
    let c = client();
    let allowed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (c, lb, allowed) = (c.clone(), lb.to_owned(), allowed.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..each {
                let r = c
                    .post(format!("{lb}/v1/namespaces/api/keys/door/hit"))
                    .send()
                    .await
                    .expect("hit");
                match r.status().as_u16() {
                    200 => {
                        allowed.fetch_add(1, Ordering::SeqCst);
                    }
                    429 => assert!(r.headers().get("retry-after").is_some()),
                    other => panic!("hit answered {other}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    allowed.load(Ordering::SeqCst)
}

async fn store_count(store: &Store, key: &str) -> Option<f64> {
    store.totals("api").await.get(key).copied()
}

mod on_every_store {
    use super::*;
    swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite] before = crate::serial; [
        convergence,
        strict_limit,
        first_touch,
    ]);
}

// SQLite is one file on one host: no store outage or replica to speak of

mod on_the_server_stores {
    use super::*;
    swin_testkit::for_stores!([postgres, redis, redis_cluster] before = crate::serial; [
        synchronous,
        synchronous_limit,
    ]);
}

mod on_postgres_and_redis {
    use super::*;
    swin_testkit::for_stores!([postgres, redis] before = crate::serial; [
        crash_and_terminate,
        join,
        gcra_and_reset,
    ]);
}
