//! A real Redis Cluster for the tests: six `redis-server` processes on loopback (three
//! primaries, three replicas) joined by `redis-cli --cluster create`, each in a
//! temporary folder, all killed when the guard drops. The cluster bus ports are chosen
//! too (`cluster-port`), not left at port + 10,000, which may not exist for an
//! ephemeral port.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, wait_for_port, ChildGuard};

#[derive(Debug)]
pub struct RedisCluster {
    /// The client ports, primaries first as `--cluster create` was given them (which
    /// node ends up a replica is the cluster's choice).
    pub ports: Vec<u16>,
    dir: tempfile::TempDir,
    servers: Vec<ChildGuard>,
}

impl RedisCluster {
    /// Starts six servers and forms the cluster; returns once every node reports
    /// `cluster_state:ok` with all 16,384 slots assigned and sees three replicas.
    pub fn start() -> RedisCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ports = Vec::new();
        let mut servers = Vec::new();
        for _ in 0..6 {
            let (port, bus) = (free_port(), free_port());
            let child = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .args(["--port", &port.to_string()])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--cluster-port", &bus.to_string()])
                .arg("--cluster-config-file")
                .arg(dir.path().join(format!("nodes-{port}.conf")))
                .arg("--dir")
                .arg(dir.path())
                .stdout(Stdio::null())
                .spawn()
                .expect("start redis-server (scripts/test installs it)");
            servers.push(ChildGuard(child));
            ports.push(port);
        }
        for &p in &ports {
            wait_for_port(p, Duration::from_secs(10));
        }
        let status = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = RedisCluster {
            ports,
            dir,
            servers,
        };
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster
    }

    /// `CLUSTER INFO` of the node on `port`.
    pub fn info(&self, port: u16) -> String {
        cli(port, &["cluster", "info"])
    }

    /// `CLUSTER NODES` as the node on `port` sees it.
    pub fn nodes(&self, port: u16) -> String {
        cli(port, &["cluster", "nodes"])
    }

    /// Seed URLs, one per node.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    fn wait_until_ok(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            // replicas are assigned after the slots: wait for them too, seen alike by all
            let ok = self.ports.iter().all(|&p| {
                let info = self.info(p);
                let replicas = self
                    .nodes(p)
                    .lines()
                    .filter(|l| l.contains("slave"))
                    .count();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_assigned:16384")
                    && replicas == 3
            });
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle within {timeout:?} (files in {})",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The cluster this test process shares (started on first use): tests that only
    /// read and write keep to a key prefix of their own on it; tests that reshard or
    /// kill servers start a cluster of their own. Statics are never dropped, so a
    /// watchdog process kills the servers and removes their folder once this process
    /// has exited.
    pub fn shared() -> &'static RedisCluster {
        static SHARED: std::sync::OnceLock<RedisCluster> = std::sync::OnceLock::new();
        SHARED.get_or_init(|| {
            let cluster = RedisCluster::start();
            let pids: Vec<String> = cluster
                .servers
                .iter()
                .map(|s| s.0.id().to_string())
                .collect();
            let script = format!(
                "while kill -0 {} 2>/dev/null; do sleep 1; done; kill -9 {}; rm -rf '{}'",
                std::process::id(),
                pids.join(" "),
                cluster.dir.path().display()
            );
            // outlives this process by design: nobody is left to wait for it
            #[allow(clippy::zombie_processes)]
            Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start the cluster's watchdog");
            cluster
        })
    }

    /// The ports of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<u16> {
        self.ports
            .iter()
            .copied()
            .filter(|&p| cli(p, &["role"]).starts_with("master"))
            .collect()
    }

    /// Stops every server now (as dropping the guard does).
    pub fn stop(self) {
        for s in self.servers {
            s.kill();
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout).into_owned()
}
