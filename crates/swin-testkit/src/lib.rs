//! Test support shared by every crate's tests: where the test services are, isolated
//! stores ([`TestStore`]) and PostgreSQL databases that drop themselves, child processes that die with the test,
//! free ports and polling with a deadline. Two kinds of cluster: [`cluster`], swin nodes
//! behind nginx for the cluster tests; [`redis_cluster`], a Redis Cluster to store in.

pub mod cluster;
mod proxies;
pub mod redis_cluster;
pub mod relay;
pub mod servers;
mod store;
pub mod tls;

use std::collections::BTreeSet;
use std::process::Child;
use std::time::{Duration, Instant};

pub use relay::Relay;
pub use servers::RedisServer;
pub use store::TestStore;

/// One scenario on several stores: for each store named (`postgres`, `redis`,
/// `redis_cluster`, `sqlite`, `valkey`, `redis8`) a module of `#[tokio::test]`s, one per scenario, each
/// calling `super::<scenario>(&store)` with a fresh isolated [`TestStore`]. With
/// `before = f;`, `f().await` runs first and what it returns is held until the test ends
/// (a lock that runs the scenarios one at a time, a binary to use).
///
/// ```text
/// swin_testkit::for_stores!([postgres, redis, redis_cluster, sqlite] [a_scenario, another]);
/// swin_testkit::for_stores!([postgres, redis] before = serial; [a_cluster_scenario]);
/// ```
#[macro_export]
macro_rules! for_stores {
    (@module $store:ident $before:path; [$($name:ident),* $(,)?]) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let _before = $before().await;
                    let s = $crate::TestStore::named(stringify!($store)).await;
                    super::$name(&s).await;
                }
            )*
        }
    };
    ([$($store:ident),+ $(,)?] before = $before:path; $names:tt) => {
        $( $crate::for_stores!(@module $store $before; $names); )+
    };
    ([$($store:ident),+ $(,)?] $names:tt) => {
        $( $crate::for_stores!(@module $store $crate::nothing_before; $names); )+
    };
}

/// What [`for_stores!`] runs before a test when told nothing.
pub async fn nothing_before() {}

/// Admin URL of the PostgreSQL the tests may create databases on (`scripts/test` sets it).
pub fn postgres_admin_url() -> String {
    std::env::var("SWIN_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The Redis the tests may write prefixed keys to.
pub fn redis_url() -> String {
    RedisServer::Redis.url()
}

/// A name no other test (or test process) uses.
pub fn unique(prefix: &str) -> String {
    format!(
        "{prefix}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// A port that was free a moment ago, never handed out twice by this process (nor by
/// another test process of the same run: see [`claimed_elsewhere`]), and below the
/// kernel's ephemeral range (32768 and up on Linux): a port the kernel picks for the
/// tests' own outgoing connections (to Redis, to a node) cannot be the one a node is
/// about to listen on. (Ports it picked itself, as `bind(0)` does, could be: a node that
/// then failed to bind was seen as another node's port answering.)
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = 20_000 + rand::random::<u16>() % 12_000;
        if given.contains(&port) || claimed_elsewhere(port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return port;
        }
    }
}

/// Whether another test process of this run holds `port`, else claims it for this one.
/// The suite runs each test in a process of its own, several at once: a port free when
/// one test picked it may not be bound yet by the node it is for when another picks.
/// Claims are files in `SWIN_TEST_PORTS` (a directory `scripts/test` makes for its run
/// and removes after it), made with `create_new`, so one process alone gets each; a
/// claim ten minutes old is a finished test's, and taken over. Without the variable (a
/// test binary run by hand, alone) there is nothing to share with.
fn claimed_elsewhere(port: u16) -> bool {
    let Some(dir) = std::env::var_os("SWIN_TEST_PORTS") else {
        return false;
    };
    let path = std::path::Path::new(&dir).join(port.to_string());
    let claim = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
    };
    match claim() {
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let old = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > Duration::from_secs(600));
            !(old && std::fs::remove_file(&path).is_ok() && claim().is_ok())
        }
        // a directory that cannot be written: this process's own claims only
        Err(_) => false,
    }
}

/// What a script printed, and whether it exited 0.
#[derive(Debug)]
pub struct Ran {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// Both outputs, stdout first.
    pub fn said(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

/// Runs `script` with `args` under the suite's Python (`SWIN_PYTHON`: grpcio and
/// xds-protos, the venv scripts/test owns).
pub fn python<S: AsRef<std::ffi::OsStr>>(script: &str, args: impl IntoIterator<Item = S>) -> Ran {
    let python = std::env::var("SWIN_PYTHON")
        .expect("SWIN_PYTHON: a Python with grpcio and xds-protos (scripts/test provides it)");
    let out = std::process::Command::new(python)
        .arg(script)
        .args(args)
        .output()
        .expect("run the Python script");
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Blocks until something listens on `port`, or panics after `timeout`.
pub fn wait_for_port(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "nothing listened on port {port} within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Polls `ok` until it holds, or panics after `timeout`.
pub async fn wait_until(timeout: Duration, what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what}: not reached within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A child process killed when the guard drops (a failing test leaves nothing behind).
#[derive(Debug)]
pub struct ChildGuard(pub Child);

impl ChildGuard {
    /// Sends SIGTERM and waits for the exit.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        signal(&self.0, "TERM");
        self.0.wait().expect("wait for child")
    }

    /// Sends SIGKILL and waits.
    pub fn kill(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }

    pub fn signal(&self, name: &str) {
        signal(&self.0, name);
    }
}

fn signal(child: &Child, name: &str) {
    std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A fresh PostgreSQL database, dropped (WITH FORCE) when the guard drops.
#[derive(Debug)]
pub struct TestDatabase {
    pub url: String,
    admin: String,
    name: String,
}

impl TestDatabase {
    pub async fn create() -> TestDatabase {
        let admin = postgres_admin_url();
        let name = unique("swin_test");
        let pool = sqlx::PgPool::connect(&admin)
            .await
            .expect("connect to the test PostgreSQL (scripts/test starts it)");
        sqlx::query(&format!("CREATE DATABASE \"{name}\""))
            .execute(&pool)
            .await
            .expect("create test database");
        pool.close().await;
        let (base, _) = admin
            .rsplit_once('/')
            .expect("admin url ends with /database");
        TestDatabase {
            url: format!("{base}/{name}"),
            admin,
            name,
        }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        // Drop cannot await: run the cleanup on a runtime of its own.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                if let Ok(pool) = sqlx::PgPool::connect(&admin).await {
                    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
                    let _ = sqlx::query(&sql).execute(&pool).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// A PostgreSQL server of the test's own in a temp dir (initdb, trust auth, fsync off),
/// which the test can stop and start again. Run as user `postgres` when the test runs
/// as root (initdb refuses root).
#[derive(Debug)]
pub struct EphemeralPostgres {
    dir: tempfile::TempDir,
    bin: std::path::PathBuf,
    pub port: u16,
}

impl EphemeralPostgres {
    pub fn init() -> EphemeralPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect(
                "PostgreSQL server binaries under /usr/lib/postgresql (scripts/test installs them)",
            )
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|p| p.join("initdb").exists())
            .max_by_key(|p| {
                p.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            })
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().expect("temp dir");
        if is_root() {
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(
                status.success(),
                "chown to user postgres (does the user exist?)"
            );
        }
        let pg = EphemeralPostgres {
            dir,
            bin,
            port: free_port(),
        };
        pg.run(
            "initdb",
            &["-D", &pg.data(), "-U", "postgres", "--auth=trust", "-N"],
        );
        pg
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn run(&self, tool: &str, args: &[&str]) {
        let exe = self.bin.join(tool);
        let mut cmd = if is_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            std::process::Command::new(&exe)
        };
        let out = cmd.args(args).output().expect("run a PostgreSQL tool");
        assert!(
            out.status.success(),
            "{tool} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn start(&self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.path().display()
        );
        let log = self.dir.path().join("log").display().to_string();
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-l", &log, "-w", "-o", &opts, "start"],
        );
    }

    /// Stops at once, as a crash would (`-m immediate`).
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &["-D", &self.data(), "-m", "immediate", "-w", "stop"],
        );
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for EphemeralPostgres {
    fn drop(&mut self) {
        let exe = self.bin.join("pg_ctl");
        let data = self.data();
        let mut cmd = if is_root() {
            let mut c = std::process::Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            std::process::Command::new(&exe)
        };
        let _ = cmd
            .args(["-D", &data, "-m", "immediate", "stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A redis-server of the test's own on `port`, with an append-only file in `dir` so it
/// keeps its data over a restart.
pub fn start_redis(port: u16, dir: &std::path::Path) -> ChildGuard {
    RedisServer::Redis.start(port, dir)
}
