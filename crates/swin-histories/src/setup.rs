//! The system under test: a store of the run's own (a Redis prefix, or a Redis server
//! of its own when the store is to be paused; a PostgreSQL database; a SQLite file), N
//! `swin-node` processes each reaching the store through a [`Relay`] of its own (the
//! network stores) with its own config and `data_dir`, and the namespaces: `main` in
//! the mode under test and `side` in the same mode, the second namespace of batches.
//! Windows are a day long, so no window ends during a run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use swin_testkit::cluster::{use_node_binary, Node};
use swin_testkit::{ChildGuard, Relay, TestStore};

use crate::accounting::Key;

/// The store kinds a run can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Redis,
    Postgres,
    Sqlite,
}

/// The admission mode under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Periodic,
    Sync,
    Strict,
}

/// The namespaces and their limits per day: `main` and `side`.
pub const NAMESPACES: [(&str, f64); 2] = [("main", 2000.0), ("side", 150.0)];

/// The hot keys of a namespace.
pub fn hot_keys(ns: &str) -> &'static [&'static str] {
    match ns {
        "main" => &["hk-0", "hk-1", "hk-2"],
        _ => &["sk-0", "sk-1"],
    }
}

/// A node's config over the store section `section`.
pub fn config(section: &str, mode: Mode) -> String {
    let (rate, strict) = match mode {
        Mode::Periodic => ("0.2", ""),
        Mode::Sync => ("0", ""),
        Mode::Strict => (
            "0.2",
            "admission = \"strict\"\non_store_failure = \"deny\"\n",
        ),
    };
    let mut out = format!("store_timeout = 1\nanswer_timeout = 0.5\n{section}");
    for (name, limit) in NAMESPACES {
        out.push_str(&format!(
            "\n[[namespaces]]\nname = \"{name}\"\nwindow_sizes = [86400]\nsync_rate = {rate}\n\
             store = \"main\"\nlimits = [{{ window_size = 86400, limit = {limit} }}]\n{strict}"
        ));
    }
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
    pub nodes: Vec<Mutex<Node>>,
    pub configs: Vec<PathBuf>,
    pub bases: Vec<String>,
    _dir: tempfile::TempDir,
}

async fn store(
    kind: StoreKind,
    own_redis: bool,
    dir: &std::path::Path,
) -> (TestStore, Option<ChildGuard>) {
    match kind {
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
    }
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
        let (store, redis) = store(kind, own_redis, dir.path()).await;
        let mut relays = Vec::new();
        let mut configs = Vec::new();
        for i in 0..n {
            let section = if kind == StoreKind::Sqlite {
                store.section()
            } else {
                let relay = Relay::to_url(&store.url).await;
                let s = store.section_via(&relay);
                relays.push(relay);
                s
            };
            let node_dir = dir.path().join(format!("node-{i}"));
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let path = node_dir.join("swin.toml");
            std::fs::write(&path, config(&section, mode)).expect("write config");
            configs.push(path);
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
            nodes: nodes.into_iter().map(Mutex::new).collect(),
            configs,
            bases,
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

    /// Starts node `i` again on its port and `data_dir` if it is not running.
    pub fn restart(&self, i: usize) {
        let mut node = self.node(i);
        if !node.is_running() {
            node.restart(&self.configs[i]);
        }
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
