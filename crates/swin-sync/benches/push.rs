//! Push throughput of each store beside the store's own floor, and synchronous
//! increment latency. Prints a table; asserts nothing about speed.
//!
//! Run: `cargo bench -p swin-sync --bench push` (PostgreSQL and Redis as for the tests;
//! psql and redis-cli on PATH). `SWIN_BENCH_ROWS` (default 100000) and
//! `SWIN_BENCH_RUNS` (default 5) size it.
//!
//! - push: `Store::push` of ROWS distinct dirty counters (one batch, exactly-once record
//!   included), fresh keys each run.
//! - floor: the same number of fresh rows sent raw — PostgreSQL: one hand-written
//!   multi-row `INSERT … ON CONFLICT DO UPDATE` through `psql -f`; Redis: `HINCRBYFLOAT`
//!   + `EXPIRE` per key through `redis-cli --pipe`.
//! - cluster: the same push on a three-primary Redis Cluster (six local processes the
//!   bench starts), with and without `wait_replicas = 1`; its floor is the raw
//!   commands of each primary's keys through one `redis-cli --pipe` per primary, all at
//!   once. `slot/slot` is envoyproxy/ratelimit's way on the same cluster: the floor's raw
//!   commands in one pipeline per slot, each awaited before the next.
//! - sync: 32 concurrent callers doing synchronous increments, latency p50/p99.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use swin_core::{CounterOptions, Diff, NamespaceCounters, UnixMs, WindowSize};
use swin_sync::store::{PostgresStore, RedisStore, SqliteStore};
use swin_sync::{NamespaceSync, Push, Store, SyncMode};
use swin_testkit::TestDatabase;

const START: i64 = 1_763_784_000;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn diffs(run: usize, rows: usize) -> Vec<Diff> {
    (0..rows)
        .map(|i| Diff {
            key: format!(
                "r{run}-10.{}.{}.{}",
                (i >> 16) & 255,
                (i >> 8) & 255,
                i & 255
            )
            .into(),
            window_size: 60,
            window_start: START,
            value: 1.0,
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

async fn time_push(store: &Store, run: usize, rows: usize) -> f64 {
    let d = diffs(run, rows);
    let t = Instant::now();
    let push = Push {
        node_id: &swin_sync::PushId::new("bench"),
        seq: Some(run as u64 + 1),
        diffs: &d,
    };
    let totals = store.push("bench", push).await.expect("push").totals;
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(totals.len(), rows);
    secs
}

fn time_psql_floor(url: &str, run: usize, rows: usize) -> f64 {
    let mut sql = String::with_capacity(rows * 80);
    sql.push_str(
        "INSERT INTO swin_counters (namespace, key, window_size, window_start, count) VALUES\n",
    );
    for (i, d) in diffs(run + 1000, rows).iter().enumerate() {
        if i > 0 {
            sql.push_str(",\n");
        }
        sql.push_str(&format!(
            "('bench','{}',60,to_timestamp({}),1)",
            d.key, d.window_start
        ));
    }
    sql.push_str(
        "\nON CONFLICT (namespace, key, window_size, window_start) \
         DO UPDATE SET count = swin_counters.count + EXCLUDED.count;\n",
    );
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), sql).expect("write sql");
    let t = Instant::now();
    let out = Command::new("psql")
        .args(["-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f"])
        .arg(file.path())
        .output()
        .expect("psql on PATH");
    let secs = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    secs
}

fn resp(args: &[&str]) -> String {
    let mut s = format!("*{}\r\n", args.len());
    for a in args {
        s.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
    }
    s
}

fn time_redis_floor(url: &str, prefix: &str, run: usize, rows: usize) -> f64 {
    let mut input = String::with_capacity(rows * 160);
    for d in diffs(run + 1000, rows) {
        let key = format!("{prefix}:{{5:bench:{}}}:60", d.key);
        input.push_str(&resp(&["HINCRBYFLOAT", &key, &START.to_string(), "1"]));
        input.push_str(&resp(&["EXPIRE", &key, "180"]));
    }
    let t = Instant::now();
    let mut child = Command::new("redis-cli")
        .args(["-u", url, "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-cli on PATH");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("pipe");
    let status = child.wait().expect("redis-cli");
    let secs = t.elapsed().as_secs_f64();
    assert!(status.success());
    secs
}

/// The raw floor on a cluster: each primary's share of the keys through a `redis-cli
/// --pipe` of its own, all running at once; seconds until the last is done.
fn time_cluster_floor(owner: &[u16], prefix: &str, run: usize, rows: usize) -> f64 {
    let mut inputs: std::collections::BTreeMap<u16, String> = Default::default();
    for d in diffs(run + 1000, rows) {
        let tag = format!("5:bench:{}", d.key);
        let key = format!("{prefix}:{{{tag}}}:60");
        let slot = crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384;
        let input = inputs.entry(owner[usize::from(slot)]).or_default();
        input.push_str(&resp(&["HINCRBYFLOAT", &key, &START.to_string(), "1"]));
        input.push_str(&resp(&["EXPIRE", &key, "180"]));
    }
    let t = Instant::now();
    let children: Vec<_> = inputs
        .into_iter()
        .map(|(port, input)| {
            let mut child = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "--pipe"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-cli on PATH");
            let mut stdin = child.stdin.take().expect("stdin");
            let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
            (child, writer)
        })
        .collect();
    for (mut child, writer) in children {
        writer.join().expect("writer").expect("pipe");
        assert!(child.wait().expect("redis-cli").success());
    }
    t.elapsed().as_secs_f64()
}

/// The way envoyproxy/ratelimit's cluster client sends: one pipeline per slot (the same
/// raw commands as the floor), each awaited before the next is sent.
async fn time_slot_by_slot(owner: &[u16], prefix: &str, run: usize, rows: usize) -> f64 {
    let mut conns: std::collections::BTreeMap<u16, redis::aio::MultiplexedConnection> =
        Default::default();
    for &port in owner {
        if let std::collections::btree_map::Entry::Vacant(e) = conns.entry(port) {
            let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("url");
            e.insert(
                client
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connect"),
            );
        }
    }
    let mut by_slot: std::collections::BTreeMap<u16, redis::Pipeline> = Default::default();
    for d in diffs(run + 2000, rows) {
        let tag = format!("5:bench:{}", d.key);
        let key = format!("{prefix}:{{{tag}}}:60");
        let slot = crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384;
        let pipe = by_slot.entry(slot).or_default();
        pipe.cmd("HINCRBYFLOAT")
            .arg(&key)
            .arg(START)
            .arg(1)
            .ignore();
        pipe.cmd("EXPIRE").arg(&key).arg(180).ignore();
    }
    let t = Instant::now();
    for (slot, pipe) in &by_slot {
        let conn = conns
            .get_mut(&owner[usize::from(*slot)])
            .expect("a primary");
        pipe.query_async::<()>(conn).await.expect("pipeline");
    }
    t.elapsed().as_secs_f64()
}

/// The port of the primary serving each slot (`CLUSTER SLOTS`).
async fn slot_owners(url: &str) -> Vec<u16> {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let ranges: Vec<(u16, u16, (String, u16))> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async::<Vec<redis::Value>>(&mut conn)
        .await
        .expect("cluster slots")
        .into_iter()
        .map(|r| {
            let redis::Value::Array(parts) = r else {
                panic!("slot range")
            };
            let start: u16 = redis::from_redis_value(&parts[0]).expect("start");
            let end: u16 = redis::from_redis_value(&parts[1]).expect("end");
            let redis::Value::Array(node) = &parts[2] else {
                panic!("node")
            };
            let host: String = redis::from_redis_value(&node[0]).expect("host");
            let port: u16 = redis::from_redis_value(&node[1]).expect("port");
            (start, end, (host, port))
        })
        .collect();
    let mut owner = vec![0u16; 16384];
    for (start, end, (_, port)) in ranges {
        for o in &mut owner[usize::from(start)..=usize::from(end)] {
            *o = port;
        }
    }
    owner
}

/// (p50 ms, p99 ms, hits/s) of synchronous increments.
async fn sync_latency(store: &Store, callers: usize, per_caller: usize) -> (f64, f64, f64) {
    let sizes = [WindowSize::new(60).expect("size")];
    let counters = Arc::new(NamespaceCounters::new(
        "bench-sync",
        &sizes,
        CounterOptions::default(),
    ));
    let engine = Arc::new(NamespaceSync::new(
        counters,
        SyncMode::Synchronous,
        Some(store.clone()),
        "bench".into(),
        Duration::from_secs(5),
    ));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..callers {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_caller);
            for i in 0..per_caller {
                let key = format!("k{}", (c * 7 + i) % 64);
                let now = UnixMs::from_system_time(std::time::SystemTime::now());
                let s = Instant::now();
                engine
                    .increment(&key, 60, 1.0, now)
                    .await
                    .expect("increment");
                lat.push(s.elapsed().as_secs_f64() * 1e3);
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("caller"));
    }
    let rate = all.len() as f64 / t.elapsed().as_secs_f64();
    assert!(
        engine.status().degraded.is_none(),
        "a synchronous increment fell back to local memory"
    );
    all.sort_by(|a, b| a.total_cmp(b));
    (all[all.len() / 2], all[all.len() * 99 / 100], rate)
}

fn row(store: &str, push: f64, floor: Option<f64>, rows: usize) {
    match floor {
        Some(f) => println!(
            "{store:<10} {push:>10.3} {f:>10.3} {:>12.0} {:>9.2}x",
            rows as f64 / push,
            push / f
        ),
        None => println!(
            "{store:<10} {push:>10.3} {:>10} {:>12.0} {:>10}",
            "-",
            rows as f64 / push,
            "-"
        ),
    }
}

#[tokio::main]
async fn main() {
    let rows = env_usize("SWIN_BENCH_ROWS", 100_000);
    let runs = env_usize("SWIN_BENCH_RUNS", 5);
    println!("push of {rows} distinct dirty counters, median of {runs} runs (fresh keys each run)");
    println!(
        "{:<10} {:>10} {:>10} {:>12} {:>10}",
        "store", "push s", "floor s", "push rows/s", "push/floor"
    );

    let db = TestDatabase::create().await;
    let pg = Store::Postgres(PostgresStore::new(&db.url, 8).expect("pg"));
    pg.migrate().await.expect("migrate");
    let (mut p, mut f) = (Vec::new(), Vec::new());
    for run in 0..runs {
        p.push(time_push(&pg, run, rows).await);
        f.push(time_psql_floor(&db.url, run, rows));
    }
    row("postgres", median(p), Some(median(f)), rows);

    let redis_url = swin_testkit::redis_url();
    let prefix = swin_testkit::unique("swin-bench");
    let rs = RedisStore::new(&redis_url, &prefix).expect("redis");
    let redis = Store::Redis(rs.clone());
    let (mut p, mut f) = (Vec::new(), Vec::new());
    for run in 0..runs {
        p.push(time_push(&redis, run, rows).await);
        f.push(time_redis_floor(&redis_url, &prefix, run, rows));
    }
    row("redis", median(p), Some(median(f)), rows);

    let rc = swin_testkit::redis_cluster::RedisCluster::start();
    let owner = slot_owners(&rc.urls()[0]).await;
    let cluster = Store::Redis(
        RedisStore::cluster(&rc.urls(), &prefix, &Default::default(), 0).expect("cluster"),
    );
    let waiting = Store::Redis(
        RedisStore::cluster(&rc.urls(), &prefix, &Default::default(), 1).expect("cluster"),
    );
    let (mut p, mut w, mut f) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        p.push(time_push(&cluster, run, rows).await);
        w.push(time_push(&waiting, run + runs, rows).await);
        f.push(time_cluster_floor(&owner, &prefix, run, rows));
    }
    let floor = median(f);
    row("cluster", median(p), Some(floor), rows);
    row("cluster+w1", median(w), Some(floor), rows);
    let mut e = Vec::new();
    for run in 0..runs {
        e.push(time_slot_by_slot(&owner, &prefix, run, rows).await);
    }
    row("slot/slot", median(e), Some(floor), rows);

    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("b.db").display());
    let lite = Store::Sqlite(SqliteStore::connect(&url).await.expect("sqlite"));
    lite.migrate().await.expect("migrate");
    let mut p = Vec::new();
    for run in 0..runs {
        p.push(time_push(&lite, run, rows).await);
    }
    row("sqlite", median(p), None, rows);

    println!();
    println!("synchronous increments, 32 concurrent callers x 200 each");
    println!(
        "{:<10} {:>10} {:>10} {:>12}",
        "store", "p50 ms", "p99 ms", "hits/s"
    );
    for (name, store) in [
        ("redis", &redis),
        ("cluster", &cluster),
        ("cluster+w1", &waiting),
        ("postgres", &pg),
        ("sqlite", &lite),
    ] {
        let (p50, p99, rate) = sync_latency(store, 32, 200).await;
        println!("{name:<10} {p50:>10.3} {p99:>10.3} {rate:>12.0}");
    }
    let _ = rs.delete_prefix().await;
}
