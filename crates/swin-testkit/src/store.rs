//! One store per test, isolated (its own PostgreSQL database, Redis key prefix or SQLite
//! file) and removed when the test ends, even when it fails. The same type serves the
//! in-process tests (through [`TestStore::store`]) and the tests that run node processes
//! (through [`TestStore::section`], the config that points a node at it, and
//! [`TestStore::totals`], what the store holds).

use std::collections::BTreeMap;
use std::path::PathBuf;

use swin_sync::store::{PostgresStore, RedisStore, SqliteStore};
use swin_sync::Store;

use crate::{RedisServer, TestDatabase};

/// A store for one test and whatever removes it afterwards.
#[derive(Debug)]
pub struct TestStore {
    /// The store, for the test's own calls (PostgreSQL and Redis connect on first use).
    pub store: Store,
    pub url: String,
    place: Place,
}

#[derive(Debug)]
enum Place {
    /// The database to drop; `None`: a server of the test's own, which goes with it.
    Postgres {
        _db: Option<TestDatabase>,
    },
    Redis {
        prefix: String,
    },
    /// A key prefix on a Redis Cluster, whose nodes are at these URLs.
    RedisCluster {
        prefix: String,
        urls: Vec<String>,
    },
    Sqlite(tempfile::TempDir),
}

impl TestStore {
    /// The store `name`s (`postgres`, `redis`, `redis_cluster`, `sqlite`, and the Redis
    /// store on `valkey` and `redis8`), isolated as each of those says: what
    /// [`crate::for_stores!`] makes per test.
    pub async fn named(name: &str) -> TestStore {
        match name {
            "postgres" => TestStore::postgres().await,
            "redis" => TestStore::redis(),
            "redis_cluster" => TestStore::redis_cluster(),
            "sqlite" => TestStore::sqlite().await,
            "valkey" => TestStore::redis_on(RedisServer::Valkey).await,
            "redis8" => TestStore::redis_on(RedisServer::Redis8).await,
            other => panic!("no test store {other:?}"),
        }
    }

    /// A fresh database on the test PostgreSQL, migrated.
    pub async fn postgres() -> TestStore {
        let db = TestDatabase::create().await;
        let mut t = TestStore::postgres_at(&db.url);
        t.store.migrate().await.expect("migrate");
        t.place = Place::Postgres { _db: Some(db) };
        t
    }

    /// A database the test brings (a server of its own); not migrated, not dropped.
    pub fn postgres_at(url: &str) -> TestStore {
        TestStore {
            store: Store::Postgres(PostgresStore::new(url, 8).expect("postgres url")),
            url: url.to_owned(),
            place: Place::Postgres { _db: None },
        }
    }

    /// A fresh key prefix on the test Redis.
    pub fn redis() -> TestStore {
        TestStore::redis_at(&crate::redis_url(), &crate::unique("swin-test"))
    }

    /// A fresh key prefix on the shared `server` (Valkey 9, Redis 8), checked to be that
    /// server.
    pub async fn redis_on(server: RedisServer) -> TestStore {
        let url = server.url();
        if server != RedisServer::Redis {
            server.check(&url).await;
        }
        TestStore::redis_at(&url, &crate::unique("swin-test"))
    }

    /// `prefix` on a Redis the test chooses (perhaps one of its own, not yet started);
    /// the prefix's keys are deleted at the end when that Redis still answers.
    pub fn redis_at(url: &str, prefix: &str) -> TestStore {
        TestStore {
            store: Store::Redis(RedisStore::new(url, prefix).expect("redis url")),
            url: url.to_owned(),
            place: Place::Redis {
                prefix: prefix.to_owned(),
            },
        }
    }

    /// A fresh key prefix on this test process's shared Redis Cluster.
    pub fn redis_cluster() -> TestStore {
        let urls = crate::redis_cluster::RedisCluster::shared().urls();
        TestStore::redis_cluster_at(&urls, &crate::unique("swin-test"), 0)
    }

    /// `prefix` on the cluster whose nodes are at `urls` (seeds), with `wait_replicas`.
    pub fn redis_cluster_at(urls: &[String], prefix: &str, wait_replicas: u32) -> TestStore {
        let store = RedisStore::cluster(urls, prefix, &Default::default(), wait_replicas)
            .expect("cluster urls");
        TestStore {
            store: Store::Redis(store),
            url: urls[0].clone(),
            place: Place::RedisCluster {
                prefix: prefix.to_owned(),
                urls: urls.to_vec(),
            },
        }
    }

    /// A SQLite file in a temp dir of its own, migrated.
    pub async fn sqlite() -> TestStore {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("swin.db").display());
        let store = Store::Sqlite(SqliteStore::connect(&url).await.expect("open sqlite"));
        store.migrate().await.expect("migrate");
        TestStore {
            store,
            url,
            place: Place::Sqlite(dir),
        }
    }

    /// The SQLite file, for tests that lock or inspect it.
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        match &self.place {
            Place::Sqlite(dir) => Some(dir.path().join("swin.db")),
            _ => None,
        }
    }

    /// The `[stores.main]` section of a node config pointing at this store.
    pub fn section(&self) -> String {
        let (kind, url) = (self.store.kind(), &self.url);
        match &self.place {
            Place::Redis { prefix } => {
                format!(
                    "[stores.main]\nkind = \"{kind}\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\n"
                )
            }
            Place::RedisCluster { prefix, urls } => format!(
                "[stores.main]\nkind = \"{kind}\"\nurls = {urls:?}\nprefix = \"{prefix}\"\n"
            ),
            _ => format!("[stores.main]\nkind = \"{kind}\"\nurl = \"{url}\"\n"),
        }
    }

    /// The `[stores.main]` section of a node config reaching this store through
    /// `relay` (a network store: PostgreSQL, Redis), in plain text (the relay matches
    /// requests by their bytes).
    pub fn section_via(&self, relay: &crate::Relay) -> String {
        let mut url = relay.url_for(&self.url);
        match &self.place {
            Place::Sqlite(_) | Place::RedisCluster { .. } => {
                panic!("a relay stands between a node and one server over the network")
            }
            Place::Postgres { .. } => {
                let glue = if url.contains('?') { '&' } else { '?' };
                url = format!("{url}{glue}sslmode=disable");
            }
            Place::Redis { .. } => {}
        }
        self.section().replacen(&self.url, &url, 1)
    }

    /// Every key's count in `namespace`, summed over all windows.
    pub async fn totals(&self, namespace: &str) -> BTreeMap<String, f64> {
        self.totals_in(namespace, None).await
    }

    /// Every key's count in `namespace`, summed over the windows of `window_size` (all
    /// sizes when `None`), read the way an operator would: SQL on the table, HGETALL on
    /// the hashes. Nothing stored yet (no table, no key) is an empty map.
    /// `sql`'s one number on a SQL store (PostgreSQL's placeholders or none; an
    /// operator's query on the tables), `None` on Redis.
    pub async fn sql_number(&self, sql: &str) -> Option<i64> {
        match &self.place {
            Place::Postgres { .. } => {
                let pool = sqlx::PgPool::connect(&self.url).await.expect("connect");
                let n = sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("query");
                pool.close().await;
                Some(n)
            }
            Place::Sqlite(_) => {
                let pool = sqlx::SqlitePool::connect(&self.url).await.expect("connect");
                let n = sqlx::query_scalar(sql)
                    .fetch_one(&pool)
                    .await
                    .expect("query");
                pool.close().await;
                Some(n)
            }
            Place::Redis { .. } | Place::RedisCluster { .. } => None,
        }
    }

    pub async fn totals_in(
        &self,
        namespace: &str,
        window_size: Option<u32>,
    ) -> BTreeMap<String, f64> {
        let size = window_size.map_or(-1, i64::from);
        let sql = "SELECT key, sum(count) FROM swin_counters WHERE namespace = $1 \
                   AND ($2 < 0 OR window_size = $2) GROUP BY key";
        match &self.place {
            Place::Postgres { .. } => {
                sum_by_key!(sqlx::PgPool, &self.url, sql, namespace, size)
            }
            Place::Sqlite(_) => sum_by_key!(sqlx::SqlitePool, &self.url, sql, namespace, size),
            Place::Redis { prefix } => {
                redis_totals(&self.url, prefix, namespace, window_size).await
            }
            Place::RedisCluster { prefix, urls } => {
                // each primary holds its own keys; replicas hold copies
                let mut out = BTreeMap::new();
                for url in urls {
                    if !is_primary(url).await {
                        continue;
                    }
                    for (k, v) in redis_totals(url, prefix, namespace, window_size).await {
                        *out.entry(k).or_default() += v;
                    }
                }
                out
            }
        }
    }
}

/// Runs the sum on either SQL store (their pool types differ, the query does not).
macro_rules! sum_by_key {
    ($pool:ty, $url:expr, $sql:expr, $namespace:expr, $size:expr) => {{
        let pool = <$pool>::connect($url).await.expect("connect");
        // before a node migrated there is no table: nothing stored yet
        let rows: Vec<(String, f64)> = sqlx::query_as($sql)
            .bind($namespace)
            .bind($size)
            .fetch_all(&pool)
            .await
            .unwrap_or_default();
        pool.close().await;
        rows.into_iter().collect()
    }};
}
use sum_by_key;

/// Sums the count fields (a window start each; not the `n:<node>` push records or the
/// `h:<start>:<holder>` strict-admission totals) of the namespace's hashes.
async fn redis_totals(
    url: &str,
    prefix: &str,
    namespace: &str,
    window_size: Option<u32>,
) -> BTreeMap<String, f64> {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let head = format!("{prefix}:{{{}:{namespace}:", namespace.len());
    let mut out = BTreeMap::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        for hash in keys {
            let Some((key, hash_size)) = hash
                .strip_prefix(&head)
                .and_then(|r| r.rsplit_once("}:"))
                .map(|(k, s)| (k.to_owned(), s.to_owned()))
            else {
                continue;
            };
            if hash_size == "gcra" || window_size.is_some_and(|w| w.to_string() != hash_size) {
                continue;
            }
            let fields: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&hash)
                .query_async(&mut conn)
                .await
                .expect("hgetall");
            let sum: f64 = fields
                .iter()
                .filter(|(f, _)| f.parse::<i64>().is_ok())
                .map(|(_, v)| v.parse::<f64>().expect("count"))
                .sum();
            *out.entry(key).or_default() += sum;
        }
        cursor = next;
        if cursor == 0 {
            return out;
        }
    }
}

/// Whether the Redis at `url` answers and is a primary (`ROLE`).
async fn is_primary(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
        return false;
    };
    let role: Result<Vec<redis::Value>, _> = redis::cmd("ROLE").query_async(&mut conn).await;
    matches!(role.as_deref(), Ok([redis::Value::BulkString(r), ..]) if r == b"master")
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let Store::Redis(r) = &self.store {
            let r = r.clone();
            // Drop cannot await: delete the test's keys on a runtime of its own (a Redis
            // of the test's own may be gone already: nothing to delete then).
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async { r.delete_prefix().await })
            })
            .join();
        }
    }
}
