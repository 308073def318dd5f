//! Test harness for the cluster tests in the top-level `tests/`: N real `swin-node`
//! processes on loopback ports behind a real nginx balancing round robin, stores the
//! test can stop and start, and TCP proxies that delay or hold a store connection
//! (`proxies`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::ChildGuard;

static NODE_BINARY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Names the `swin-node` binary to run: the cluster tests are a test target of the
/// swin-node package, so Cargo builds the binary first and passes its path as
/// `CARGO_BIN_EXE_swin-node`. `SWIN_TEST_NODE_BINARY`, when set, names another build
/// instead (to check that a test fails on an older commit).
pub fn use_node_binary(path: &str) {
    let chosen = std::env::var_os("SWIN_TEST_NODE_BINARY")
        .map_or_else(|| PathBuf::from(path), PathBuf::from);
    let _ = NODE_BINARY.set(chosen);
}

fn node_binary() -> &'static Path {
    NODE_BINARY
        .get()
        .expect("call use_node_binary(env!(\"CARGO_BIN_EXE_swin-node\")) first")
}

fn nginx_binary() -> PathBuf {
    ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .expect("nginx installed (scripts/test installs Debian's nginx-light)")
}

/// One `swin-node` process.
#[derive(Debug)]
pub struct Node {
    child: Option<ChildGuard>,
    pub port: u16,
    pub base: String,
}

impl Node {
    /// Starts a node on a free loopback port.
    pub fn spawn(config: &Path) -> Node {
        Node::start(config, crate::free_port(), &[])
    }

    /// [`Node::spawn`] with more environment variables (`LD_PRELOAD` of Debian's
    /// libfaketime, for a node whose clock is off).
    pub fn spawn_with_env(config: &Path, env: &[(&str, &str)]) -> Node {
        Node::start(config, crate::free_port(), env)
    }

    /// SIGTERM and wait; whether it exited 0.
    pub fn terminate(&mut self) -> bool {
        self.child.take().is_some_and(|c| {
            let status = c.terminate();
            if !status.success() {
                eprintln!("node on port {} exited with {status}", self.port);
            }
            status.success()
        })
    }

    pub fn signal(&self, name: &str) {
        if let Some(c) = &self.child {
            c.signal(name);
        }
    }

    /// SIGKILL and wait (a crash: nothing pushed, nothing spooled).
    pub fn kill(&mut self) {
        if let Some(c) = self.child.take() {
            c.kill();
        }
    }

    /// Starts the node again on its port with `config` (its spool found again under
    /// `data/` beside it), once it has stopped or been killed.
    pub fn restart(&mut self, config: &Path) {
        self.restart_with_env(config, &[]);
    }

    /// [`Node::restart`] with more environment variables (a clock off: libfaketime).
    pub fn restart_with_env(&mut self, config: &Path, env: &[(&str, &str)]) {
        assert!(self.child.is_none(), "the node is still running");
        *self = Node::start(config, self.port, env);
    }

    fn start(config: &Path, port: u16, env: &[(&str, &str)]) -> Node {
        let child = Command::new(node_binary())
            .envs(env.iter().copied())
            .arg("--config")
            .arg(config)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            // the spool beside the config: per test, and found again by a restart
            .env(
                "SWIN_DATA_DIR",
                config.parent().unwrap_or(Path::new(".")).join("data"),
            )
            .env("RUST_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("start swin-node");
        let child = ChildGuard(child);
        crate::wait_for_port(port, Duration::from_secs(30));
        Node {
            child: Some(child),
            port,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }
}

/// Debian's libfaketime (package `faketime`), multi-threaded build, if installed: with
/// `FAKETIME` (`+40s`) and `FAKETIME_DONT_FAKE_MONOTONIC=1`, a node whose wall clock is
/// off while its timers run true.
pub fn libfaketime() -> Option<String> {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ]
    .iter()
    .map(|d| format!("{d}/faketime/libfaketimeMT.so.1"))
    .find(|p| Path::new(p).exists())
}

/// Nodes behind nginx, all reading one config file.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Node>,
    /// Base URL of the load balancer.
    pub lb: String,
    nginx: ChildGuard,
    dir: tempfile::TempDir,
    config: PathBuf,
}

impl Cluster {
    /// `config` is a swin-node TOML without `listen`. Every node's port is in the nginx
    /// upstream from the start (a node started later with [`Cluster::join`] too).
    pub fn start(n: usize, config: &str, spare: usize) -> Cluster {
        Cluster::start_with(n, config, spare, "")
    }

    /// As [`Cluster::start`], with `extra` added to nginx's `http` block (where the
    /// upstream `swin` names every node).
    pub fn start_with(n: usize, config: &str, spare: usize, extra: &str) -> Cluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let config_path = dir.path().join("swin.toml");
        std::fs::write(&config_path, config).expect("write config");
        let ports: Vec<u16> = (0..n + spare).map(|_| crate::free_port()).collect();
        let nodes = ports[..n]
            .iter()
            .map(|&p| Node::start(&config_path, p, &[]))
            .collect::<Vec<_>>();
        let mut all = nodes;
        for &p in &ports[n..] {
            all.push(Node {
                child: None,
                port: p,
                base: format!("http://127.0.0.1:{p}"),
            });
        }
        let lb_port = crate::free_port();
        let nginx = start_nginx(dir.path(), lb_port, &ports, extra);
        Cluster {
            nodes: all,
            lb: format!("http://127.0.0.1:{lb_port}"),
            nginx,
            dir,
            config: config_path,
        }
    }

    /// Nodes that are running.
    pub fn running(&self) -> impl Iterator<Item = &Node> {
        self.nodes.iter().filter(|n| n.is_running())
    }

    pub fn kill(&mut self, i: usize) {
        if let Some(c) = self.nodes[i].child.take() {
            c.kill();
        }
    }

    /// SIGTERM and wait; returns whether the node exited 0.
    pub fn terminate(&mut self, i: usize) -> bool {
        self.nodes[i].terminate()
    }

    /// Starts the first spare node (or a stopped one) and returns its index.
    pub fn join(&mut self) -> usize {
        let i = self
            .nodes
            .iter()
            .position(|n| !n.is_running())
            .expect("a spare node slot");
        let port = self.nodes[i].port;
        self.nodes[i] = Node::start(&self.config, port, &[]);
        i
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn nginx_pid(&self) -> u32 {
        self.nginx.0.id()
    }
}

fn start_nginx(dir: &Path, port: u16, upstreams: &[u16], extra: &str) -> ChildGuard {
    let servers: String = upstreams
        .iter()
        .map(|p| format!("server 127.0.0.1:{p} max_fails=0;\n"))
        .collect();
    let d = dir.display();
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log crit;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n access_log off;\n client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n\
         fastcgi_temp_path {d}/fastcgi;\n uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
         upstream swin {{\n{servers} keepalive 32;\n }}\n\
         server {{\n  listen 127.0.0.1:{port};\n  location / {{\n   proxy_pass http://swin;\n   proxy_http_version 1.1;\n\
         proxy_set_header Connection \"\";\n   proxy_next_upstream error timeout http_502;\n   proxy_connect_timeout 1s;\n  }}\n }}\n{extra}\n}}\n"
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).expect("write nginx.conf");
    let child = Command::new(nginx_binary())
        .arg("-p")
        .arg(dir)
        .arg("-c")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nginx");
    let guard = ChildGuard(child);
    crate::wait_for_port(port, Duration::from_secs(10));
    guard
}

/// The reply of an increment or read: the first window's counts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Counts {
    pub current: f64,
    pub previous: f64,
}

/// POSTs a batch of `(key, value)` increments to namespace `ns`; panics unless 200.
pub async fn increment_batch(
    client: &reqwest::Client,
    base: &str,
    ns: &str,
    items: &[(String, f64)],
) {
    let increments: Vec<serde_json::Value> = items
        .iter()
        .map(|(k, v)| serde_json::json!({"namespace": ns, "key": k, "value": v}))
        .collect();
    let r = client
        .post(format!("{base}/v1/increments"))
        .json(&serde_json::json!({ "increments": increments }))
        .send()
        .await
        .expect("post batch");
    assert_eq!(r.status(), 200, "batch answered {}", r.status());
}

/// A key's route `op` (`acquire`, `release`, `renew`, `hit` …) with a JSON body: the
/// status and the JSON answer.
pub async fn key_call(
    client: &reqwest::Client,
    base: &str,
    ns: &str,
    key: &str,
    op: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let r = client
        .post(format!("{base}/v1/namespaces/{ns}/keys/{key}/{op}"))
        .json(&body)
        .send()
        .await
        .expect("send");
    let status = r.status().as_u16();
    (status, r.json().await.expect("json"))
}

/// A node's `/metrics` exposition.
pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text")
}

/// The value of the sample `series` (name and labels as written, e.g.
/// `swin_spool_files` or `swin_leases_in_flight{namespace="slots"}`) in an exposition.
pub fn metric_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// One increment; `None` when the node did not answer (it is down).
pub async fn increment(
    client: &reqwest::Client,
    base: &str,
    ns: &str,
    key: &str,
) -> Option<(u16, Counts)> {
    let r = client
        .post(format!("{base}/v1/namespaces/{ns}/keys/{key}/increment"))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.ok()?;
    Some((status, counts(&v)))
}

pub async fn read(client: &reqwest::Client, base: &str, ns: &str, key: &str) -> Counts {
    let v: serde_json::Value = client
        .get(format!("{base}/v1/namespaces/{ns}/keys/{key}"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    counts(&v)
}

fn counts(v: &serde_json::Value) -> Counts {
    let w = &v["windows"][0];
    Counts {
        current: w["current"].as_f64().unwrap_or(f64::NAN),
        previous: w["previous"].as_f64().unwrap_or(f64::NAN),
    }
}

/// Polls `check` until it holds; returns how long that took, or panics after `limit`.
pub async fn within(limit: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub use crate::proxies::{DelayProxy, HoldProxy};
pub use crate::{start_redis, TestStore};

/// The cluster tests' namespace on a [`TestStore`]: `api`, one window of an hour.
pub trait ClusterStore {
    /// Three nodes' config: a short store timeout so an outage shows at once, and
    /// requests that wait for it all (`answer_timeout` = `store_timeout`): the tests
    /// hold synchronous answers to every hit acknowledged before them, which a store
    /// slower than the default half second on a loaded machine would not give.
    fn config(&self, sync_rate: f64) -> String;
}

impl ClusterStore for TestStore {
    fn config(&self, sync_rate: f64) -> String {
        format!(
            "store_timeout = 1\nanswer_timeout = 1\n\n{}\n[[namespaces]]\nname = \"api\"\nwindow_sizes = [3600]\nsync_rate = {sync_rate}\nstore = \"main\"\n",
            self.section()
        )
    }
}
