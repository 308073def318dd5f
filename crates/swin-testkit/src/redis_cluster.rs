//! A real Redis Cluster for the tests: six `redis-server` processes on loopback (three
//! primaries, three replicas) joined by `redis-cli --cluster create`, each in a
//! temporary folder, all killed when the guard drops. The cluster bus ports are chosen
//! too (`cluster-port`), not left at port + 10,000, which may not exist for an
//! ephemeral port.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, ChildGuard};

#[derive(Debug)]
pub struct RedisCluster {
    /// The client ports, primaries first as `--cluster create` was given them (which
    /// node ends up a replica is the cluster's choice).
    pub ports: Vec<u16>,
    /// Each node's cluster bus port.
    buses: Vec<u16>,
    /// A cluster that speaks TLS only, with a password: its CA.
    pub tls: Option<crate::tls::TestCa>,
    dir: tempfile::TempDir,
    servers: Vec<ChildGuard>,
}

impl RedisCluster {
    /// Starts six servers and forms the cluster; returns once every node reports
    /// `cluster_state:ok` with all 16,384 slots assigned, sees three replicas, and every
    /// replica has synced with its primary.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(None)
    }

    /// As [`RedisCluster::start`], but every node listens on a TLS port only (clients,
    /// replication and the cluster bus), with a certificate from a CA made here, and
    /// asks for [`crate::tls::PASSWORD`] (the `default` user's).
    pub fn start_secured() -> RedisCluster {
        RedisCluster::start_with(Some(crate::tls::TestCa::new()))
    }

    fn start_with(tls: Option<crate::tls::TestCa>) -> RedisCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let (mut ports, mut buses, mut servers) = (Vec::new(), Vec::new(), Vec::new());
        while servers.len() < 6 {
            // a port taken meanwhile (tests start clusters side by side): other ports
            let (port, bus) = (free_port(), free_port());
            if let Some(server) = spawn(dir.path(), port, bus, tls.as_ref()) {
                servers.push(server);
                ports.push(port);
                buses.push(bus);
            }
        }
        let out = Command::new("redis-cli")
            .args(cli_security(tls.as_ref()))
            .args(["--cluster", "create"])
            .args(ports.iter().map(|p| format!("127.0.0.1:{p}")))
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster {
            ports,
            buses,
            tls,
            dir,
            servers,
        };
        cluster.wait_until_ok(Duration::from_secs(30));
        cluster
    }

    /// `CLUSTER INFO` of the node on `port`.
    pub fn info(&self, port: u16) -> String {
        self.cli(port, &["cluster", "info"])
    }

    /// `CLUSTER NODES` as the node on `port` sees it.
    pub fn nodes(&self, port: u16) -> String {
        self.cli(port, &["cluster", "nodes"])
    }

    /// Seed URLs, one per node.
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| match self.tls {
                Some(_) => format!("rediss://127.0.0.1:{p}"),
                None => format!("redis://127.0.0.1:{p}"),
            })
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
                // a replica that never synced cannot take over: wait for every link
                let linked = !self.cli(p, &["role"]).starts_with("slave")
                    || self
                        .cli(p, &["info", "replication"])
                        .contains("master_link_status:up");
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_assigned:16384")
                    && replicas == 3
                    && linked
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
            .filter(|&p| self.cli(p, &["role"]).starts_with("master"))
            .collect()
    }

    /// The node's cluster id.
    pub fn node_id(&self, port: u16) -> String {
        self.cli(port, &["cluster", "myid"]).trim().to_owned()
    }

    /// The port of the replica of the primary on `port`.
    pub fn replica_of(&self, port: u16) -> u16 {
        let id = self.node_id(port);
        let nodes = self.nodes(port);
        let line = nodes
            .lines()
            .find(|l| l.split(' ').nth(3) == Some(id.as_str()))
            .unwrap_or_else(|| panic!("no replica of {port} in\n{nodes}"));
        let addr = line.split(' ').nth(1).expect("address");
        addr.split(['@', ':'])
            .nth(1)
            .and_then(|p| p.parse().ok())
            .expect("port")
    }

    /// Closes the primary on `port`'s replication links (`CLIENT KILL TYPE replica`).
    pub fn kill_replica_links(&self, port: u16) {
        self.cli(port, &["client", "kill", "type", "replica"]);
    }

    /// Sends a signal (`STOP`, `CONT`, `KILL`, …) to the server on `port`.
    pub fn signal(&self, port: u16, name: &str) {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .expect("a node's port");
        self.servers[i].signal(name);
    }

    /// Moves `slots` slots (with their keys) from the primary on `from` to the one on
    /// `to`, as an operator would (`redis-cli --cluster reshard`).
    pub fn reshard(&self, from: u16, to: u16, slots: u32) {
        let out = Command::new("redis-cli")
            .args(cli_security(self.tls.as_ref()))
            .args(["--cluster", "reshard", &format!("127.0.0.1:{from}")])
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster reshard");
        assert!(
            out.status.success(),
            "reshard failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Waits until the node on `port` is a primary and sees the cluster whole.
    pub fn wait_for_primary(&self, port: u16, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !(self.cli(port, &["role"]).starts_with("master")
            && self.info(port).contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "{port} was not promoted within {timeout:?}; the logs end:\n{}",
                self.ports
                    .iter()
                    .map(|&p| format!("== {p}\n{}", self.log_tail(p)))
                    .collect::<Vec<_>>()
                    .join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server on `port` again (after a kill): it keeps its cluster config
    /// file, so it rejoins, as a replica of whoever took its slots over.
    pub fn restart(&mut self, port: u16) {
        let i = self
            .ports
            .iter()
            .position(|&p| p == port)
            .expect("a node's port");
        let server = spawn(self.dir.path(), port, self.buses[i], self.tls.as_ref())
            .unwrap_or_else(|| panic!("restart the server on {port}"));
        self.servers[i] = server;
    }

    /// The last lines of the node's log.
    pub fn log_tail(&self, port: u16) -> String {
        let log = std::fs::read_to_string(self.dir.path().join(format!("{port}.log")))
            .unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(12)..].join("\n")
    }

    /// Stops every server now (as dropping the guard does).
    pub fn stop(self) {
        for s in self.servers {
            s.kill();
        }
    }
}

/// A cluster node on `port` (bus on `bus`), its files in `dir`; `None` when it did
/// not come up listening (a port taken).
fn spawn(
    dir: &std::path::Path,
    port: u16,
    bus: u16,
    tls: Option<&crate::tls::TestCa>,
) -> Option<ChildGuard> {
    let mut command = Command::new("redis-server");
    command.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]);
    match tls {
        None => {
            command.args(["--port", &port.to_string()]);
        }
        Some(ca) => {
            command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--tls-cluster", "yes", "--tls-replication", "yes"])
                .args(ca.redis_server_args())
                .args(["--requirepass", crate::tls::PASSWORD])
                .args(["--masterauth", crate::tls::PASSWORD]);
        }
    }
    let child = command
        .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
        // replicas sync at once (the default waits 5 s for more to join)
        .args(["--repl-diskless-sync-delay", "0"])
        .args(["--cluster-port", &bus.to_string()])
        .arg("--cluster-config-file")
        .arg(dir.join(format!("nodes-{port}.conf")))
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(format!("{port}.log")))
        .stdout(Stdio::null())
        .spawn()
        .expect("start redis-server (scripts/test installs it)");
    let mut server = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            // someone listens: ours, unless it exits for a port another server holds
            std::thread::sleep(Duration::from_millis(100));
            return server
                .0
                .try_wait()
                .ok()
                .flatten()
                .is_none()
                .then_some(server);
        }
        if server.0.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// redis-cli's options for a secured cluster: TLS with its CA, and the password.
fn cli_security(tls: Option<&crate::tls::TestCa>) -> Vec<String> {
    match tls {
        None => Vec::new(),
        Some(ca) => vec![
            "--tls".into(),
            "--cacert".into(),
            ca.ca_file.display().to_string(),
            "-a".into(),
            crate::tls::PASSWORD.into(),
            "--no-auth-warning".into(),
        ],
    }
}

impl RedisCluster {
    fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli")
            .args(cli_security(self.tls.as_ref()))
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
