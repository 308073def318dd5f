//! Every acknowledged hit counted exactly once, whatever a reload, an outage or a
//! shutdown does — against the real binary and the real stores:
//! - two nodes under load, SIGHUP changing window sizes, sync rate, max_counters, the
//!   store URL (same database), then removing and re-adding the namespace: the store
//!   holds exactly what was acknowledged;
//! - SIGTERM while the store is away: the node spools, exits 0, and the next start
//!   replays the spool: exact totals;
//! - /readyz answers 503 from the start while the store cannot be reached.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use swin_testkit::cluster::{within, TestStore};

use super::support::{increment, node, spool_files};

const HEAD: &str = "store_timeout = 1\nshutdown_grace = 5\n";

/// A config: `section` for the store, a local namespace that keeps the file valid when
/// `api` is left out, and `api` with `api_body` when given.
fn config(section: &str, api_body: Option<&str>) -> String {
    let mut c = format!(
        "{HEAD}{section}\n[[namespaces]]\nname = \"other\"\nwindow_sizes = [60]\nsync_rate = -1\n"
    );
    if let Some(body) = api_body {
        c += &format!("\n[[namespaces]]\nname = \"api\"\nstore = \"main\"\n{body}\n");
    }
    c
}

/// The same store under another URL: a query parameter (or Redis' explicit db 0).
fn other_url(section: &str) -> String {
    if let Some((head, rest)) = section.split_once("urls = [\"") {
        // a cluster: its first seed named with db 0
        let (seed, tail) = rest.split_once('"').expect("quoted");
        return format!("{head}urls = [\"{seed}/0\"{tail}");
    }
    let (head, rest) = section.split_once("url = \"").expect("a url");
    let (url, tail) = rest.split_once('"').expect("quoted");
    let url2 = if url.starts_with("redis") {
        format!("{url}/0")
    } else if url.starts_with("sqlite") {
        format!("{url}?mode=rwc")
    } else {
        format!("{url}?application_name=reloaded")
    };
    format!("{head}url = \"{url2}\"{tail}")
}

type Acked = Arc<Mutex<BTreeMap<String, f64>>>;

/// Increments on `bases` round robin until `stop`, recording each acknowledged hit.
fn load(
    bases: Vec<String>,
    stop: Arc<AtomicBool>,
    acked: Acked,
    worker: usize,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let mut i = worker;
        // bounded in count and time whatever happens
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while !stop.load(Ordering::SeqCst) && i < 200_000 && tokio::time::Instant::now() < deadline
        {
            let key = format!("k{}", i % 7);
            let r = client
                .post(format!(
                    "{}/v1/namespaces/api/keys/{key}/increment",
                    bases[i % bases.len()]
                ))
                .json(&serde_json::json!({"window_size": 3600}))
                .send()
                .await;
            if r.is_ok_and(|r| r.status() == 200) {
                *acked.lock().expect("lock").entry(key).or_default() += 1.0;
            }
            i += 4;
        }
    })
}

/// Every reload kind in one run under load, in the order an operator would make them; hence its length.
async fn reloads_keep_every_acknowledged_hit(backend: TestStore) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    let section = backend.section();
    let moved = other_url(&section);
    let steps: Vec<(&str, String)> = vec![
        (
            "start",
            config(&section, Some("window_sizes = [3600]\nsync_rate = 0.1")),
        ),
        (
            "window_sizes",
            config(&section, Some("window_sizes = [3600, 60]\nsync_rate = 0.1")),
        ),
        (
            "sync_rate",
            config(
                &section,
                Some("window_sizes = [3600, 60]\nsync_rate = 0.05"),
            ),
        ),
        (
            "synchronous",
            config(&section, Some("window_sizes = [3600, 60]\nsync_rate = 0")),
        ),
        (
            "max_counters",
            config(
                &section,
                Some("window_sizes = [3600, 60]\nsync_rate = 0.05\nmax_counters = 500000"),
            ),
        ),
        (
            "store url",
            config(
                &moved,
                Some("window_sizes = [3600, 60]\nsync_rate = 0.05\nmax_counters = 500000"),
            ),
        ),
        ("removed", config(&moved, None)),
        (
            "re-added",
            config(&moved, Some("window_sizes = [3600]\nsync_rate = 0.1")),
        ),
    ];
    std::fs::write(&path, &steps[0].1).expect("write");
    let mut a = node(&path);
    let mut b = node(&path);
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Acked = Default::default();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            load(
                vec![a.base.clone(), b.base.clone()],
                stop.clone(),
                acked.clone(),
                w,
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (what, text) in &steps[1..] {
        std::fs::write(&path, text).expect("write");
        a.signal("HUP");
        b.signal("HUP");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let seen: f64 = acked.lock().expect("lock").values().sum();
        assert!(seen > 0.0, "load reaches the nodes after {what}");
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("load task");
    }
    assert!(a.terminate(), "node a exits 0");
    assert!(b.terminate(), "node b exits 0");
    let acked = acked.lock().expect("lock").clone();
    let total: f64 = acked.values().sum();
    assert!(total > 100.0, "enough load to mean something: {total}");
    assert_eq!(
        backend.totals_in("api", Some(3600)).await,
        acked,
        "store totals = acknowledged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_reloads_keep_every_acknowledged_hit() {
    reloads_keep_every_acknowledged_hit(TestStore::postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_reloads_keep_every_acknowledged_hit() {
    reloads_keep_every_acknowledged_hit(TestStore::redis()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_reloads_keep_every_acknowledged_hit() {
    reloads_keep_every_acknowledged_hit(TestStore::redis_cluster()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_reloads_keep_every_acknowledged_hit() {
    reloads_keep_every_acknowledged_hit(TestStore::sqlite().await).await;
}

/// How a test takes its store away and brings it back.
trait Outage {
    async fn stop(&mut self);
    async fn start(&mut self);
}

/// 20 hits pushed, the store goes away, 30 more, SIGTERM: exit 0 with a spool; the store
/// comes back and a new start replays it: 50 in the store, the spool gone.
async fn sigterm_while_the_store_is_away(backend: TestStore, mut outage: impl Outage) {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(
        &path,
        config(
            &backend.section(),
            Some("window_sizes = [3600]\nsync_rate = 0.1"),
        ),
    )
    .expect("write");
    let client = reqwest::Client::new();
    let mut n = node(&path);
    increment(&client, &n.base, "api", "k", 20).await;
    within(Duration::from_secs(15), "20 in the store", async || {
        backend.totals("api").await.get("k") == Some(&20.0)
    })
    .await;
    outage.stop().await;
    increment(&client, &n.base, "api", "k", 30).await;
    assert!(n.terminate(), "SIGTERM exits 0 with the store away");
    assert_eq!(
        spool_files(dir.path()).len(),
        1,
        "what was unconfirmed is spooled"
    );
    outage.start().await;
    let mut again = node(&path);
    within(Duration::from_secs(15), "50 in the store", async || {
        backend.totals("api").await.get("k") == Some(&50.0)
    })
    .await;
    // the file goes just after the push that emptied it
    within(
        Duration::from_secs(5),
        "the replayed spool removed",
        async || spool_files(dir.path()).is_empty(),
    )
    .await;
    assert!(again.terminate());
    assert_eq!(
        backend.totals("api").await.get("k"),
        Some(&50.0),
        "applied once"
    );
}

struct PgOutage(Arc<swin_testkit::EphemeralPostgres>);

impl Outage for PgOutage {
    async fn stop(&mut self) {
        self.0.stop();
    }
    async fn start(&mut self) {
        self.0.start();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sigterm_while_the_store_is_away_loses_nothing() {
    let pg = Arc::new(swin_testkit::EphemeralPostgres::init());
    pg.start();
    let backend = TestStore::postgres_at(&pg.url());
    sigterm_while_the_store_is_away(backend, PgOutage(pg)).await;
}

struct RedisOutage {
    port: u16,
    dir: tempfile::TempDir,
    server: Option<swin_testkit::ChildGuard>,
}

impl Outage for RedisOutage {
    async fn stop(&mut self) {
        if let Some(s) = self.server.take() {
            s.kill();
        }
    }
    async fn start(&mut self) {
        self.server = Some(swin_testkit::start_redis(self.port, self.dir.path()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sigterm_while_the_store_is_away_loses_nothing() {
    let port = swin_testkit::free_port();
    let dir = tempfile::tempdir().expect("dir");
    let server = swin_testkit::start_redis(port, dir.path());
    let backend = TestStore::redis_at(&format!("redis://127.0.0.1:{port}"), "swin");
    let outage = RedisOutage {
        port,
        dir,
        server: Some(server),
    };
    sigterm_while_the_store_is_away(backend, outage).await;
}

/// SQLite is a file: it is "away" while another connection holds its write lock.
struct SqliteOutage {
    url: String,
    lock: Option<sqlx::SqliteConnection>,
}

impl Outage for SqliteOutage {
    async fn stop(&mut self) {
        use sqlx::Connection;
        let mut c = sqlx::SqliteConnection::connect(&self.url)
            .await
            .expect("open");
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut c)
            .await
            .expect("lock");
        self.lock = Some(c);
    }
    async fn start(&mut self) {
        use sqlx::Connection;
        if let Some(mut c) = self.lock.take() {
            sqlx::query("ROLLBACK")
                .execute(&mut c)
                .await
                .expect("unlock");
            c.close().await.expect("close");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_sigterm_while_the_store_is_away_loses_nothing() {
    let backend = TestStore::sqlite().await;
    let url = backend.url.clone();
    sigterm_while_the_store_is_away(backend, SqliteOutage { url, lock: None }).await;
}

/// Before a store-backed namespace has reached its store, the node is not ready: at
/// once, not only after its first sync fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_from_the_start_while_the_store_is_unreachable() {
    let dir = tempfile::tempdir().expect("dir");
    let client = reqwest::Client::new();
    let missing_db = super::support::missing_postgres_database();
    let sections = [
        format!(
            "[stores.main]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\n",
            swin_testkit::free_port()
        ),
        format!("[stores.main]\nkind = \"postgres\"\nurl = \"{missing_db}\"\n"),
    ];
    for section in sections {
        let path = dir.path().join("swin.toml");
        std::fs::write(
            &path,
            config(&section, Some("window_sizes = [60]\nsync_rate = 0.1")),
        )
        .expect("write");
        let mut n = node(&path);
        let r = client
            .get(format!("{}/readyz", n.base))
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), 503, "{section}");
        let body: serde_json::Value = r.json().await.expect("json");
        assert_eq!(body["namespaces"][0]["namespace"], "api", "{body}");
        // increments still answer, from local memory
        increment(&client, &n.base, "api", "k", 1).await;
        assert!(n.terminate(), "{section}");
    }
}
