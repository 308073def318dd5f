//! The system under test: a store of the run's own (a Redis prefix, or a Redis server
//! of its own when the store is to be paused; a PostgreSQL database; a SQLite file), N
//! `swin-node` processes each reaching the store through a [`Relay`] of its own (the
//! network stores) with its own config, `data_dir` and gRPC port, and the namespaces:
//! `main` in the mode under test (overrun `debt`), `side` in the same mode (overrun
//! `cap`, the second namespace of batches), `edge` in the same mode with one Envoy
//! descriptor rule (`user` → a limit per day), and `jobs` (concurrency leases).
//! Windows are a day long, so no window ends during a run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use swin_testkit::cluster::{use_node_binary, Node};
use swin_testkit::redis_cluster::RedisCluster;
use swin_testkit::{ChildGuard, Relay, TestStore};

use crate::accounting::Key;

/// The store kinds a run can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Redis,
    Postgres,
    Sqlite,
    /// A Redis Cluster of the run's own (six servers): no relay, so no lost replies or cuts.
    RedisCluster,
}

/// The admission mode under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Periodic,
    Sync,
    Strict,
}

/// The namespaces of counts and their limits per day: `main`, `side` and `edge` (its
/// descriptor rule's `requests_per_unit`).
pub const NAMESPACES: [(&str, f64); 3] = [("main", 4000.0), ("side", 150.0), ("edge", 300.0)];

/// The limits `side` takes in turn when a reload changes the config.
pub const SIDE_LIMITS: [f64; 3] = [150.0, 120.0, 180.0];

/// Leases in flight per key of `jobs`.
pub const JOBS_LIMIT: u64 = 3;

/// The keys of `jobs`.
pub const JOBS_KEYS: [&str; 2] = ["jk-0", "jk-1"];

/// The values of `edge`'s `user` descriptor entry.
pub const EDGE_USERS: [&str; 2] = ["u0", "u1"];

/// The hot keys of a namespace.
pub fn hot_keys(ns: &str) -> &'static [&'static str] {
    match ns {
        "main" => &["hk-0", "hk-1", "hk-2"],
        _ => &["sk-0", "sk-1"],
    }
}

/// What a reload may change in a node's config.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tuning {
    /// `side`'s limit per day.
    pub side_limit: f64,
    /// The periodic namespaces' `sync_rate` (seconds).
    pub sync_rate: f64,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            side_limit: SIDE_LIMITS[0],
            sync_rate: 0.2,
        }
    }
}

/// A node's config over the store section `section`, serving gRPC on `grpc_port`.
pub fn config(section: &str, mode: Mode, grpc_port: u16, t: Tuning) -> String {
    let rate = match mode {
        Mode::Sync => "0".to_owned(),
        _ => t.sync_rate.to_string(),
    };
    let strict = match mode {
        Mode::Strict => "admission = \"strict\"\non_store_failure = \"deny\"\n",
        _ => "",
    };
    let mut out = format!(
        "store_timeout = 1\nanswer_timeout = 0.5\ngrpc_listen = \"127.0.0.1:{grpc_port}\"\n{section}"
    );
    let common = format!("sync_rate = {rate}\nstore = \"main\"\n{strict}");
    let day = |limit: f64| format!("limits = [{{ window_size = 86400, limit = {limit} }}]\n");
    let main = day(NAMESPACES[0].1);
    let side = day(t.side_limit);
    out.push_str(&format!(
        "\n[[namespaces]]\nname = \"main\"\nwindow_sizes = [86400]\n{common}{main}\
         \n[[namespaces]]\nname = \"side\"\nwindow_sizes = [86400]\noverrun = \"cap\"\n{common}{side}\
         \n[[namespaces]]\nname = \"edge\"\n{common}\
         [[namespaces.descriptors]]\nkey = \"user\"\n\
         rate_limit = {{ unit = \"day\", requests_per_unit = {} }}\n\
         \n[[namespaces]]\nname = \"jobs\"\nalgorithm = \"concurrency\"\nlimit = {JOBS_LIMIT}\n\
         lease_ttl = 30\nsync_rate = 1\nstore = \"main\"\n",
        NAMESPACES[2].1
    ));
    out
}

/// The store, the relays and the nodes of one run.
#[derive(Debug)]
pub struct Cluster {
    pub store: TestStore,
    /// A Redis server of the run's own (the store to pause), and where it keeps its files.
    pub redis: Option<ChildGuard>,
    /// One per node (none on SQLite: no network between a node and its file).
    pub relays: Vec<Relay>,
    /// A Redis Cluster of the run's own.
    pub redis_cluster: Option<RedisCluster>,
    pub nodes: Vec<Mutex<Node>>,
    pub configs: Vec<PathBuf>,
    pub bases: Vec<String>,
    /// Each node's gRPC address (`host:port`).
    pub grpc: Vec<String>,
    /// Each node's store section, mode and gRPC port: what its config is made of.
    sections: Vec<String>,
    mode: Mode,
    /// Each node's environment when (re)started (a clock off: libfaketime).
    envs: Vec<Mutex<Vec<(String, String)>>>,
    _dir: tempfile::TempDir,
}

async fn store(
    kind: StoreKind,
    own_redis: bool,
    dir: &std::path::Path,
) -> (TestStore, Option<ChildGuard>, Option<RedisCluster>) {
    if kind == StoreKind::RedisCluster {
        let rc = tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("start a Redis Cluster");
        let prefix = swin_testkit::unique("swin-histories");
        let store = TestStore::redis_cluster_at(&rc.urls(), &prefix, 0);
        return (store, None, Some(rc));
    }
    let (store, server) = match kind {
        StoreKind::Redis if own_redis => {
            let port = swin_testkit::free_port();
            let server = swin_testkit::start_redis(port, dir);
            let url = format!("redis://127.0.0.1:{port}");
            let store = TestStore::redis_at(&url, &swin_testkit::unique("swin-histories"));
            (store, Some(server))
        }
        StoreKind::Redis => (
            TestStore::redis_at(
                &swin_testkit::redis_url(),
                &swin_testkit::unique("swin-histories"),
            ),
            None,
        ),
        StoreKind::Postgres => (TestStore::postgres().await, None),
        StoreKind::Sqlite => (TestStore::sqlite().await, None),
        StoreKind::RedisCluster => unreachable!("started above"),
    };
    (store, server, None)
}

impl Cluster {
    /// Starts the store and `n` nodes of `binary` in `mode`; waits until each is ready.
    pub async fn start(
        kind: StoreKind,
        mode: Mode,
        n: usize,
        own_redis: bool,
        binary: &str,
    ) -> Cluster {
        use_node_binary(binary);
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, redis, redis_cluster) = store(kind, own_redis, dir.path()).await;
        let mut relays = Vec::new();
        let mut configs = Vec::new();
        let mut sections = Vec::new();
        let mut grpc = Vec::new();
        for i in 0..n {
            let section = if matches!(kind, StoreKind::Sqlite | StoreKind::RedisCluster) {
                store.section()
            } else {
                let relay = Relay::to_url(&store.url).await;
                // PostgreSQL: every statement sent with its text (not a prepared one's
                // name), so that the relay can lose the reply to any of them
                let s = store.section_via(&relay).replace(
                    "sslmode=disable",
                    "sslmode=disable&statement-cache-capacity=0",
                );
                relays.push(relay);
                s
            };
            let node_dir = dir.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let path = node_dir.join("swin.toml");
            let port = swin_testkit::free_port();
            let text = config(&section, mode, port, Tuning::default());
            std::fs::write(&path, text).expect("write config");
            configs.push(path);
            sections.push(section);
            grpc.push(format!("127.0.0.1:{port}"));
        }
        let mut nodes = Vec::new();
        for path in &configs {
            let path = path.clone();
            let node = tokio::task::spawn_blocking(move || Node::spawn(&path))
                .await
                .expect("start a node");
            nodes.push(node);
        }
        let bases = nodes.iter().map(|n| n.base.clone()).collect();
        let cluster = Cluster {
            store,
            redis,
            relays,
            redis_cluster,
            nodes: nodes.into_iter().map(Mutex::new).collect(),
            configs,
            bases,
            grpc,
            sections,
            mode,
            envs: (0..n).map(|_| Mutex::new(Vec::new())).collect(),
            _dir: dir,
        };
        for i in 0..n {
            cluster.ready(i).await;
        }
        cluster
    }

    /// Waits (up to 30 s) until node `i` answers `/readyz` with 200.
    pub async fn ready(&self, i: usize) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        let url = format!("{}/readyz", self.bases[i]);
        while Instant::now() < deadline {
            if let Ok(r) = http.get(&url).send().await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        eprintln!("node {i} not ready within 30 s");
    }

    fn node(&self, i: usize) -> std::sync::MutexGuard<'_, Node> {
        self.nodes[i].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// SIGKILL node `i`.
    pub fn kill(&self, i: usize) {
        self.node(i).kill();
    }

    /// Starts node `i` again on its port and `data_dir` if it is not running, in the
    /// environment it last had.
    pub fn restart(&self, i: usize) {
        let mut node = self.node(i);
        if !node.is_running() {
            let env = self.envs[i]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            node.restart_with_env(&self.configs[i], &env);
        }
    }

    /// Stops node `i` (SIGTERM: whether it exited 0) and starts it again with `env`.
    pub fn restart_in(&self, i: usize, env: Vec<(String, String)>) -> bool {
        let clean = {
            let mut node = self.node(i);
            !node.is_running() || node.terminate()
        };
        *self.envs[i].lock().unwrap_or_else(|p| p.into_inner()) = env;
        self.restart(i);
        clean
    }

    /// Whether node `i` runs with its clock off.
    pub fn skewed(&self, i: usize) -> bool {
        self.envs[i]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(k, _)| k == "FAKETIME")
    }

    /// Writes node `i`'s config anew with `t` (a reload then reads it).
    pub fn retune(&self, i: usize, t: Tuning) {
        let port: u16 = self.grpc[i]
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        let text = config(&self.sections[i], self.mode, port, t);
        std::fs::write(&self.configs[i], text).expect("write config");
    }

    pub fn signal(&self, i: usize, name: &str) {
        self.node(i).signal(name);
    }

    /// SIGTERM every node: the nodes that did not exit 0.
    pub fn stop_all(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let mut node = self.node(i);
                node.is_running() && !node.terminate()
            })
            .collect()
    }

    /// Every key's count in the store, all windows.
    pub async fn totals(&self) -> BTreeMap<Key, f64> {
        let mut out = BTreeMap::new();
        for (ns, _) in NAMESPACES {
            for (k, v) in self.store.totals(ns).await {
                out.insert((ns.to_owned(), k), v);
            }
        }
        out
    }
}
