//! Properties across three nodes, each its own router, namespace and store connection as
//! three swin-node processes would be, on the real stores:
//! - in synchronous mode a sliding-window limit, and a GCRA bucket, are never exceeded,
//!   whatever the limit, the costs and the interleaving of concurrent hits (PostgreSQL,
//!   Redis);
//! - refunds cannot create quota: after any schedule of hits, refunds and syncs on any
//!   nodes, in synchronous and periodic mode, no stored window is negative and a node
//!   admits no more than the quota really left (PostgreSQL, Redis, SQLite).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::body::Body;
use axum::http::Request;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use swin_core::{UnixMs, WindowSize};
use swin_node::http;
use swin_node::state::AppState;
use swin_sync::store::{PostgresStore, RedisStore};
use swin_sync::{Store, SyncMode};
use tower::ServiceExt;

const HOUR: u64 = 3600;

/// Three nodes of one namespace `ns` on the store of `section` (its `[stores.main]`
/// keys), each started as a swin-node process starts its limiter.
async fn nodes(
    section: &str,
    ns: &str,
    limit: u32,
    gcra: bool,
    mode: SyncMode,
) -> Vec<Arc<AppState>> {
    let sync_rate = match mode {
        SyncMode::Periodic(p) => p.as_secs_f64(),
        SyncMode::Synchronous => 0.0,
        SyncMode::LocalOnly => -1.0,
    };
    let limits = if gcra {
        // burst `limit`, refilled over an hour: no refill to speak of during a case
        format!(
            "algorithm = \"gcra\"\ngcra = {{ burst = {limit}, count = {limit}, period = \"1h\" }}"
        )
    } else {
        format!("limits = [{{ window_size = {HOUR}, limit = {limit} }}]")
    };
    let text = format!(
        "data_dir = \"{}\"\nmigrate = false\n[stores.main]\n{section}\n\
         [[namespaces]]\nname = \"{ns}\"\nstore = \"main\"\nwindow_sizes = [{HOUR}]\n\
         sync_rate = {sync_rate}\nkey_from = \"client_address\"\n{limits}\n",
        concat!(env!("CARGO_TARGET_TMPDIR"), "/limits_property"),
    );
    let config = swin_node::config::Config::parse("p.toml", &text, &|_| None).expect("config");
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(Arc::new(AppState::start(&config).await.expect("started")));
    }
    nodes
}

/// Runs `case` on three nodes of `ns`, then stops them (their connections closed).
async fn on_nodes<F>(
    section: &str,
    (ns, limit, gcra, mode): (&str, u32, bool, SyncMode),
    case: impl FnOnce(Vec<axum::Router>) -> F,
) -> Result<(), TestCaseError>
where
    F: std::future::Future<Output = Result<(), TestCaseError>>,
{
    let states = nodes(section, ns, limit, gcra, mode).await;
    let outcome = case(states.iter().map(|s| http::router(s.clone())).collect()).await;
    for s in states {
        s.limiter.stop().await.expect("stop");
    }
    outcome
}

fn hour_start() -> i64 {
    WindowSize::new(HOUR)
        .expect("size")
        .start_of(UnixMs::from_system_time(SystemTime::now()))
}

/// One case: `hits` (node, cost) sent all at once; the admitted cost must fit the limit
/// and be exactly what the store holds (denied hits taken back).
/// One generated case from start to end, so it reads in order; hence its length.
async fn case(
    stores: &[Store; 3],
    nodes: Vec<axum::Router>,
    ns: &str,
    limit: u32,
    hits: Vec<(usize, u32)>,
    gcra: bool,
) -> Result<(), TestCaseError> {
    let started = hour_start();
    let admitted = Arc::new(AtomicU64::new(0));
    let mut sends = Vec::new();
    for (n, cost) in hits {
        let (r, admitted) = (nodes[n].clone(), admitted.clone());
        let uri = format!("/v1/namespaces/{ns}/keys/k/hit");
        sends.push(tokio::spawn(async move {
            let req = Request::builder()
                .method("POST")
                .uri(uri)
                .header("content-type", "application/json")
                .body(Body::from(format!("{{\"cost\": {cost}}}")))
                .expect("request");
            let status = r.oneshot(req).await.expect("response").status().as_u16();
            match status {
                200 => {
                    admitted.fetch_add(u64::from(cost), Ordering::SeqCst);
                }
                // 400: a cost above the limit, refused before anything is counted
                429 | 400 => {}
                other => panic!("hit answered {other}"),
            }
        }));
    }
    for s in sends {
        s.await.expect("send");
    }
    if hour_start() != started {
        // the window rolled during the case: the weighted previous hour lets more in,
        // legitimately; this case proves nothing
        return Ok(());
    }
    let admitted = admitted.load(Ordering::SeqCst);
    prop_assert!(
        admitted <= u64::from(limit),
        "{admitted} admitted against a limit of {limit}"
    );
    if gcra {
        // the store's TAT is the admitted cost's emission intervals past the first
        // spend: at most `limit` of them, so the bucket never over-fills
        let keys = [swin_core::CompactString::from("k")];
        let tat = stores[0].read_tats(ns, &keys).await.expect("read tats");
        let ei = HOUR as f64 / f64::from(limit);
        // the nodes' time is the store's: this one's clock, moved by the offset they
        // measured against the store
        let offset_s = swin_sync::clock::clock().offset_ms().unwrap_or(0) as f64 / 1e3;
        let now_s = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64()
            + offset_s;
        let ahead = tat.first().map_or(0.0, |t| t.tat_ns as f64 / 1e9 - now_s);
        let want = admitted as f64 * ei;
        prop_assert!(
            ahead <= want + 2e-3 && ahead >= want - 5.0,
            "TAT {ahead} s ahead for {admitted} admitted of {ei} s each"
        );
        return Ok(());
    }
    let size = WindowSize::new(HOUR).expect("size");
    let now = UnixMs::from_system_time(SystemTime::now());
    let key = swin_sync::WindowKey {
        key: "k".into(),
        window_size: HOUR as u32,
        window_start: size.start_of(now),
    };
    let stored = stores[0]
        .read(ns, std::slice::from_ref(&key))
        .await
        .expect("read")
        .first()
        .map_or(0.0, |t| t.count);
    prop_assert_eq!(stored, admitted as f64, "denied hits were taken back");
    Ok(())
}

/// `POST uri` on `r`: the status.
async fn post(r: &axum::Router, uri: &str, body: &str) -> u16 {
    let req = Request::builder()
        .method("POST")
        .uri(uri)
        .header("content-type", "application/json")
        .body(Body::from(body.to_owned()))
        .expect("request");
    r.clone()
        .oneshot(req)
        .await
        .expect("response")
        .status()
        .as_u16()
}

/// One step of a refund schedule.
#[derive(Debug, Clone)]
enum Step {
    Hit(usize, u32),
    Refund(usize, u32),
    Sync(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0usize..3, 1u32..4).prop_map(|(n, c)| Step::Hit(n, c)),
        (0usize..3, 1u32..6).prop_map(|(n, c)| Step::Refund(n, c)),
        (0usize..3).prop_map(Step::Sync),
    ]
}

/// Runs `steps` one at a time, syncs every node, then sends hits of cost 1 to node 0
/// until three times the limit: the stored window must not be negative and node 0 must
/// admit no more than the limit less what is stored (a GCRA bucket: no more than its
/// burst).
/// One generated case from start to end, so it reads in order; hence its length.
async fn refund_case(
    stores: &[Store; 3],
    nodes: Vec<axum::Router>,
    ns: &str,
    limit: u32,
    steps: Vec<Step>,
    gcra: bool,
) -> Result<(), TestCaseError> {
    let started = hour_start();
    let (hit, refund, sync) = (
        format!("/v1/namespaces/{ns}/keys/k/hit"),
        format!("/v1/namespaces/{ns}/keys/k/refund"),
        format!("/v1/namespaces/{ns}/sync"),
    );
    for s in steps {
        let (status, what) = match s {
            Step::Hit(n, c) => (
                post(&nodes[n], &hit, &format!("{{\"cost\": {c}}}")).await,
                "hit",
            ),
            Step::Refund(n, c) => (
                post(&nodes[n], &refund, &format!("{{\"cost\": {c}}}")).await,
                "refund",
            ),
            Step::Sync(n) => (post(&nodes[n], &sync, "").await, "sync"),
        };
        prop_assert!(
            matches!(status, 200 | 429 | 400),
            "{what} answered {status}"
        );
    }
    // node 0 must hold the key for its periodic syncs to read it (a node that never
    // saw a key decides on its own hits until then, as documented): a read adds it
    let read = Request::builder()
        .uri(format!("/v1/namespaces/{ns}/keys/k"))
        .body(Body::empty())
        .expect("request");
    let status = nodes[0].clone().oneshot(read).await.expect("read").status();
    prop_assert_eq!(status.as_u16(), 200);
    // twice: the first round pushes every node's diffs, the second reads them all back
    for _ in 0..2 {
        for n in &nodes {
            prop_assert_eq!(post(n, &sync, "").await, 200);
        }
    }
    let size = WindowSize::new(HOUR).expect("size");
    let key = swin_sync::WindowKey {
        key: "k".into(),
        window_size: HOUR as u32,
        window_start: size.start_of(UnixMs::from_system_time(SystemTime::now())),
    };
    let stored = stores[0]
        .read(ns, std::slice::from_ref(&key))
        .await
        .expect("read")
        .first()
        .map_or(0.0, |t| t.count);
    prop_assert!(stored >= 0.0, "a stored window went negative: {stored}");
    let mut admitted = 0u32;
    for _ in 0..3 * limit {
        if post(&nodes[0], &hit, "").await == 200 {
            admitted += 1;
        }
    }
    if hour_start() != started {
        return Ok(()); // the window rolled: the previous hour weighs in, legitimately
    }
    if gcra {
        prop_assert!(
            admitted <= limit,
            "{admitted} admitted past a burst of {limit}"
        );
    } else {
        // periodic mode may have over-admitted before (by design): then nothing is left
        prop_assert!(
            f64::from(admitted) <= (f64::from(limit) - stored).max(0.0),
            "{admitted} admitted with {stored} stored against a limit of {limit}"
        );
    }
    Ok(())
}

/// A runner of `cases` cases that records no failures on disk.
fn runner(cases: u32) -> TestRunner {
    TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    })
}

fn run_refunds(stores: [Store; 3], section: &str, rt: &tokio::runtime::Runtime) {
    let mut runner = runner(16);
    let n = AtomicU64::new(0);
    let strategy = (
        1u32..8,
        prop::collection::vec(step(), 1..30),
        any::<bool>(),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(limit, steps, gcra, synchronous)| {
            let ns = format!("refund{}", n.fetch_add(1, Ordering::SeqCst));
            let mode = if synchronous {
                SyncMode::Synchronous
            } else {
                SyncMode::Periodic(Duration::from_secs(3600)) // synced by the steps only
            };
            rt.block_on(on_nodes(section, (&ns, limit, gcra, mode), |nodes| {
                refund_case(&stores, nodes, &ns, limit, steps, gcra)
            }))
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

fn run(stores: [Store; 3], section: &str, rt: &tokio::runtime::Runtime) {
    let mut runner = runner(24);
    let n = AtomicU64::new(0);
    let strategy = (
        1u32..20,
        prop::collection::vec((0usize..3, 1u32..4), 1..48),
        any::<bool>(),
    );
    runner
        .run(&strategy, |(limit, hits, gcra)| {
            let ns = format!("prop{}", n.fetch_add(1, Ordering::SeqCst));
            let mode = SyncMode::Synchronous;
            rt.block_on(on_nodes(section, (&ns, limit, gcra, mode), |nodes| {
                case(&stores, nodes, &ns, limit, hits, gcra)
            }))
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn synchronous_limits_hold_across_three_nodes_postgres() {
    let rt = runtime();
    let db = rt.block_on(swin_testkit::TestDatabase::create());
    let stores = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..3 {
            let s = Store::Postgres(PostgresStore::new(&db.url, 4).expect("connect"));
            v.push(s);
        }
        v[0].migrate().await.expect("migrate");
        [v[0].clone(), v[1].clone(), v[2].clone()]
    });
    let section = format!("kind = \"postgres\"\nurl = \"{}\"", db.url);
    run(stores.clone(), &section, &rt);
    run_refunds(stores.clone(), &section, &rt);
    rt.block_on(async {
        for s in &stores {
            if let Store::Postgres(p) = s {
                p.pool().close().await;
            }
        }
    });
    // the database is dropped (WITH FORCE) after the pools closed
    drop(db);
}

#[test]
fn synchronous_limits_hold_across_three_nodes_redis() {
    let rt = runtime();
    let prefix = swin_testkit::unique("swin-prop");
    let url = swin_testkit::redis_url();
    let stores = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(Store::Redis(
                RedisStore::new(&url, &prefix).expect("connect"),
            ));
        }
        [v[0].clone(), v[1].clone(), v[2].clone()]
    });
    // cleaned up whether the property holds or not
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let section = format!("kind = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"");
        run(stores.clone(), &section, &rt);
        run_refunds(stores.clone(), &section, &rt);
    }));
    rt.block_on(async {
        if let Store::Redis(r) = &stores[0] {
            r.delete_prefix().await.expect("clean up");
        }
    });
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn refunds_cannot_create_quota_sqlite() {
    let rt = runtime();
    let dir = tempfile::tempdir().expect("dir");
    let url = format!("sqlite://{}", dir.path().join("swin.db").display());
    let stores = rt.block_on(async {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(Store::Sqlite(
                swin_sync::store::SqliteStore::connect(&url)
                    .await
                    .expect("open"),
            ));
        }
        v[0].migrate().await.expect("migrate");
        [v[0].clone(), v[1].clone(), v[2].clone()]
    });
    let section = format!("kind = \"sqlite\"\nurl = \"{url}\"");
    run_refunds(stores, &section, &rt);
}
