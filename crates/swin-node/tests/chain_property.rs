//! Property over the whole chain: three nodes in this process (each a `Node` with its
//! own engines and store connections, as three swin-node processes would be) on each
//! real store, sent random sequences of increments — values over the whole f64 range,
//! negative, tiny and huge —, hits, refunds, resets and reloads. Every request is
//! answered 2xx or 4xx, never 5xx; no namespace is left degraded; and the store holds
//! exactly the increments that were acknowledged.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::{Config as Cases, TestCaseError, TestRunner};
use swin_core::{UnixMs, WindowSize};
use swin_node::config::Config;
use swin_node::http;
use swin_node::node::{open_store, Daemon};
use swin_sync::{Store, WindowKey};
use tower::ServiceExt;

const HOUR: u32 = 3600;

/// Two shapes of the config, alternated by reloads: `count` changes its sync mode and
/// window sizes, which rebuilds it; `limited` keeps a sliding limit.
fn config_text(section: &str, data_dir: &Path, variant: bool) -> String {
    let count = if variant {
        "window_sizes = [3600, 60]\nsync_rate = 0"
    } else {
        "window_sizes = [3600]\nsync_rate = 0.05"
    };
    format!(
        "store_timeout = 2\nshutdown_grace = 5\ndata_dir = \"{}\"\n{section}\n\
         [[namespaces]]\nname = \"count\"\nstore = \"main\"\n{count}\n\n\
         [[namespaces]]\nname = \"limited\"\nstore = \"main\"\nwindow_sizes = [3600]\nsync_rate = 0.05\n\
         limits = [{{ window_size = 3600, limit = 5 }}]\n",
        data_dir.display()
    )
}

#[derive(Debug, Clone)]
enum Op {
    Increment { node: usize, key: u8, value: f64 },
    Hit { node: usize, key: u8, cost: f64 },
    Refund { node: usize, key: u8, cost: f64 },
    Reset { node: usize, key: u8 },
    Reload,
}

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => (0u32..1000).prop_map(f64::from),
        2 => (0u32..4096).prop_map(|n| f64::from(n) / 1024.0),
        1 => Just(2f64.powi(-20)),
        1 => prop_oneof![
            Just(-1.0),
            Just(-1e308),
            Just(1e308),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(9_007_199_254_740_994.0),
            Just(4_503_599_627_370_496.0),
            Just(1e16),
        ],
        1 => any::<f64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0usize..3, 0u8..4, value()).prop_map(|(node, key, value)| Op::Increment { node, key, value }),
        2 => (0usize..3, 0u8..4, value()).prop_map(|(node, key, cost)| Op::Hit { node, key, cost }),
        2 => (0usize..3, 0u8..4, value()).prop_map(|(node, key, cost)| Op::Refund { node, key, cost }),
        1 => (0usize..3, 0u8..4).prop_map(|(node, key)| Op::Reset { node, key }),
        1 => Just(Op::Reload),
    ]
}

/// Whether sums of such values stay exact in a double whatever their order: integers
/// and multiples of 2^-20 small enough for the counts this test makes.
fn sums_exactly(v: f64) -> bool {
    let scaled = v * 1_048_576.0;
    scaled.fract() == 0.0 && scaled.abs() < 2f64.powi(40)
}

/// JSON for a number: serde_json writes a non-finite one as `null` (a 400 too).
fn num(v: f64) -> String {
    serde_json::to_string(&v).expect("number")
}

async fn send(r: &axum::Router, method: &str, uri: &str, body: Option<String>) -> u16 {
    let mut req = Request::builder().method(method).uri(uri);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let resp = r
        .clone()
        .oneshot(
            req.body(body.map_or_else(Body::empty, Body::from))
                .expect("request"),
        )
        .await
        .expect("response");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(
        !String::from_utf8_lossy(&bytes).contains("null") || status >= 400,
        "a number answered as null: {}",
        String::from_utf8_lossy(&bytes)
    );
    status
}

struct Cluster {
    nodes: Vec<Daemon>,
    config: PathBuf,
    section: String,
    data_dir: tempfile::TempDir,
    variant: bool,
    store: Store,
    /// Syncs and windows refused of each namespace (node, name) when last looked at.
    refused: BTreeMap<(usize, String), (u64, u64)>,
}

impl Cluster {
    /// Windows the stores refused since the last call, on every node's engines (an
    /// engine a reload rebuilt starts from 0).
    fn newly_refused(&mut self) -> u64 {
        let mut seen = BTreeMap::new();
        let mut new = 0;
        for (i, node) in self.nodes.iter().enumerate() {
            for st in node.state.limiter.status() {
                let doc = serde_json::to_value(&st).expect("a document");
                let id = (i, st.name().to_owned());
                let count = |at: &str| doc.pointer(at).and_then(|v| v.as_u64()).expect(at);
                let now = (count("/syncs/syncs"), count("/syncs/rejected_windows"));
                // an engine a reload rebuilt counts its syncs and refusals from 0 again
                let before = match self.refused.get(&id) {
                    Some(&(syncs, refused)) if syncs <= now.0 && refused <= now.1 => refused,
                    _ => 0,
                };
                new += now.1 - before;
                seen.insert(id, now);
            }
        }
        self.refused = seen;
        new
    }

    fn router(&self, i: usize) -> axum::Router {
        http::router(self.nodes[i].state.clone())
    }

    async fn sync_all(&self) -> Result<(), TestCaseError> {
        for i in 0..3 {
            for ns in ["count", "limited"] {
                let s = send(
                    &self.router(i),
                    "POST",
                    &format!("/v1/namespaces/{ns}/sync"),
                    None,
                )
                .await;
                prop_assert_eq!(s, 200, "sync of {} on node {}", ns, i);
            }
        }
        Ok(())
    }
}

/// One generated case from start to end (nodes, hits, reloads, checks), so it reads in order; hence its length.
async fn case(c: &mut Cluster, case_no: u64, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let key = |k: u8| format!("c{case_no}-{k}");
    let mut acked: BTreeMap<String, f64> = BTreeMap::new();
    // keys to which a value was acknowledged whose sums are not exact in a double (an
    // arbitrary fraction): their totals depend on the order of the additions
    let mut inexact: std::collections::BTreeSet<String> = Default::default();
    // what was acknowledged upward per key since its last reset: a key whose sum of
    // these reaches 2^53 may have had a push refused (a window's count stays below 2^53
    // across nodes: the store refuses the push that would pass it, the node counts it)
    let mut upward: BTreeMap<String, f64> = BTreeMap::new();
    c.newly_refused();
    for op in ops {
        let status = match &op {
            Op::Increment {
                node,
                key: k,
                value,
            } => {
                let s = send(
                    &c.router(*node),
                    "POST",
                    &format!("/v1/namespaces/count/keys/{}/increment", key(*k)),
                    Some(format!(
                        "{{\"value\": {}, \"window_size\": {HOUR}}}",
                        num(*value)
                    )),
                )
                .await;
                if s == 200 {
                    *acked.entry(key(*k)).or_default() += value;
                    *upward.entry(key(*k)).or_default() += value.max(0.0);
                    if !sums_exactly(*value) {
                        inexact.insert(key(*k));
                    }
                }
                s
            }
            Op::Hit { node, key: k, cost } => {
                send(
                    &c.router(*node),
                    "POST",
                    &format!("/v1/namespaces/limited/keys/{}/hit", key(*k)),
                    Some(format!("{{\"cost\": {}}}", num(*cost))),
                )
                .await
            }
            Op::Refund { node, key: k, cost } => {
                send(
                    &c.router(*node),
                    "POST",
                    &format!("/v1/namespaces/limited/keys/{}/refund", key(*k)),
                    Some(format!("{{\"cost\": {}}}", num(*cost))),
                )
                .await
            }
            Op::Reset { node, key: k } => {
                // every node's hits pushed first, so the reset's effect is exact
                c.sync_all().await?;
                let s = send(
                    &c.router(*node),
                    "DELETE",
                    &format!("/v1/namespaces/count/keys/{}", key(*k)),
                    None,
                )
                .await;
                if s == 200 {
                    acked.insert(key(*k), 0.0);
                    upward.remove(&key(*k));
                    inexact.remove(&key(*k));
                }
                s
            }
            Op::Reload => {
                c.variant = !c.variant;
                std::fs::write(
                    &c.config,
                    config_text(&c.section, c.data_dir.path(), c.variant),
                )
                .expect("write config");
                for n in &mut c.nodes {
                    n.reload(&c.config).await;
                }
                200
            }
        };
        prop_assert!(
            (200..500).contains(&status) && status != 404,
            "{op:?} answered {status}"
        );
    }
    for _ in 0..2 {
        c.sync_all().await?;
    }
    for i in 0..3 {
        for st in c.nodes[i].state.limiter.status() {
            let doc = serde_json::to_value(&st).expect("a document");
            prop_assert!(doc["degraded"] == false, "node {i}: {st:?}");
        }
    }
    const BOUND: f64 = 9_007_199_254_740_992.0;
    let at_the_bound: std::collections::BTreeSet<String> = upward
        .iter()
        .filter(|(_, v)| **v >= BOUND)
        .map(|(k, _)| k.clone())
        .collect();
    let refused = c.newly_refused();
    prop_assert!(
        refused == 0 || !at_the_bound.is_empty(),
        "{refused} windows refused, none could reach 2^53"
    );
    let now = UnixMs::from_system_time(SystemTime::now());
    let size = WindowSize::new(u64::from(HOUR)).expect("size");
    let wanted: Vec<WindowKey> = (0..4u8)
        .flat_map(|k| {
            [size.start_of(now), size.previous_start_of(now)].map(|start| WindowKey {
                key: key(k).into(),
                window_size: HOUR,
                window_start: start,
            })
        })
        .collect();
    let mut stored: BTreeMap<String, f64> = BTreeMap::new();
    for t in c.store.read("count", &wanted).await.expect("read") {
        *stored.entry(t.key.to_string()).or_default() += t.count;
    }
    for k in &at_the_bound {
        let got = stored.get(k).copied().unwrap_or(0.0);
        prop_assert!(got < BOUND, "{k}: stored {got}, past 2^53");
    }
    acked.retain(|k, v| *v != 0.0 && !at_the_bound.contains(k));
    stored.retain(|k, v| *v != 0.0 && !at_the_bound.contains(k));
    prop_assert_eq!(
        stored.keys().collect::<Vec<_>>(),
        acked.keys().collect::<Vec<_>>(),
        "the keys stored are the keys acknowledged"
    );
    for (k, want) in &acked {
        let got = stored[k];
        if inexact.contains(k) {
            // the node adds its diffs before pushing, the test in request order
            prop_assert!(
                (got - want).abs() <= 1e-12 * want.abs().max(1.0),
                "{k}: stored {got}, acknowledged {want}"
            );
        } else {
            prop_assert_eq!(got, *want, "{}: store total = acknowledged increments", k);
        }
    }
    Ok(())
}

fn run(section: String) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let data_dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("swin.toml");
    std::fs::write(&path, config_text(&section, data_dir.path(), false)).expect("write");
    let mut cluster = rt.block_on(async {
        let config = Config::load(&path).expect("config");
        let store = open_store("main", &config.limiter().stores()["main"])
            .await
            .expect("store");
        let mut nodes = Vec::new();
        for _ in 0..3 {
            nodes.push(Daemon::start(config.clone()).await.expect("node"));
        }
        Cluster {
            nodes,
            config: path.clone(),
            section: section.clone(),
            data_dir,
            variant: false,
            store,
            refused: BTreeMap::new(),
        }
    });
    // first, a case the generator finds only now and then: two nodes each acknowledge
    // 2^52 to one key before either pushes; the store refuses the second push (2^53 would
    // not count every integer), and the other keys stay exact
    let big = 4_503_599_627_370_496.0;
    let fixed = vec![
        Op::Increment {
            node: 0,
            key: 0,
            value: 3.0,
        },
        Op::Increment {
            node: 0,
            key: 1,
            value: big,
        },
        Op::Increment {
            node: 1,
            key: 1,
            value: big,
        },
        Op::Increment {
            node: 2,
            key: 2,
            value: 7.0,
        },
    ];
    if let Err(e) = rt.block_on(case(&mut cluster, 0, fixed)) {
        panic!("the fixed case: {e}");
    }
    let mut runner = TestRunner::new(Cases {
        cases: 12,
        failure_persistence: None,
        ..Cases::default()
    });
    // the runner takes a `Fn`: the cluster and the case number live in a cell
    let result = {
        let cell = std::cell::RefCell::new((&mut cluster, 0u64));
        runner.run(&prop::collection::vec(op(), 1..40), |ops| {
            let mut guard = cell.borrow_mut();
            let (cluster, n) = &mut *guard;
            *n += 1;
            rt.block_on(case(cluster, *n, ops))
        })
    };
    rt.block_on(async {
        for node in std::mem::take(&mut cluster.nodes) {
            node.shutdown_engines().await.expect("clean shutdown");
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn the_whole_chain_keeps_exact_counts_postgres() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let db = rt.block_on(swin_testkit::TestDatabase::create());
    run(format!(
        "[stores.main]\nkind = \"postgres\"\nurl = \"{}\"\nmax_connections = 4\n",
        db.url
    ));
    drop(db);
}

#[test]
fn the_whole_chain_keeps_exact_counts_redis() {
    let prefix = swin_testkit::unique("swin-chain");
    let url = swin_testkit::redis_url();
    let outcome = std::panic::catch_unwind(|| {
        run(format!(
            "[stores.main]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\n"
        ));
    });
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let r = swin_sync::store::RedisStore::new(&url, &prefix).expect("connect");
        r.delete_prefix().await.expect("clean up");
    });
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}

#[test]
fn the_whole_chain_keeps_exact_counts_sqlite() {
    let dir = tempfile::tempdir().expect("dir");
    run(format!(
        "[stores.main]\nkind = \"sqlite\"\nurl = \"sqlite://{}\"\n",
        dir.path().join("swin.db").display()
    ));
}
