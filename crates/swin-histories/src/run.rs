//! One run: the cluster started, clients and nemesis for the run's seconds, every node
//! stopped cleanly (a node that exits non-zero is a violation), started again once to
//! drain its spool and stopped again, then the checks, printed (a run with violations is
//! shrunk by `crate::shrink`).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::check::{check, Expect, Report, Violation};
use crate::history::{Event, Request};
use crate::nemesis::{self, Fault, UNCLEAN};
use crate::setup::{Cluster, Mode, StoreKind, NAMESPACES, SIDE_LIMITS};
use crate::workload::{Client, Recorder};

/// What a run is told.
#[derive(Debug, Clone)]
pub struct Options {
    pub store: StoreKind,
    pub mode: Mode,
    pub faults: Vec<Fault>,
    pub seconds: u64,
    pub seed: u64,
    pub nodes: usize,
    pub clients: usize,
    pub node_binary: String,
    /// Where the history (JSON lines) and the nemesis's log are written.
    pub out: PathBuf,
    /// Runs a violation's shrinking may take (0: none).
    pub shrink_runs: usize,
}

/// What one run recorded and found.
#[derive(Debug)]
pub struct Ran {
    pub history: Vec<Request>,
    pub events: Vec<Event>,
    pub report: Report,
    /// The start of the day the run began in (seconds since the epoch): its window.
    pub day: u64,
    /// Where its history was written.
    pub file: PathBuf,
}

/// One run, checked; its history written, nothing printed.
pub async fn run_once(o: &Options) -> Ran {
    let day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400 * 86_400);
    let own_redis = o.faults.contains(&Fault::Pause);
    let cluster =
        Arc::new(Cluster::start(o.store, o.mode, o.nodes, own_redis, &o.node_binary).await);
    let rec = Arc::new(Recorder::new());
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(o.seconds);
    let bases = Arc::new(cluster.bases.clone());
    let clients: Vec<_> = (0..o.clients)
        .map(|i| {
            let c = Client::new(i, o.seed, bases.clone(), &cluster.grpc, rec.clone());
            tokio::spawn(c.run(deadline))
        })
        .collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    let nemesis = tokio::spawn(nemesis::run(
        cluster.clone(),
        o.faults.clone(),
        o.seed,
        t0,
        deadline,
        log.clone(),
    ));
    for c in clients {
        let _ = c.await;
    }
    let _ = nemesis.await;
    let mut violations = stop(&cluster).await;
    let history = rec.history();
    let events = log.lock().unwrap_or_else(|p| p.into_inner()).clone();
    violations.extend(
        events
            .iter()
            .filter(|e| e.what.contains(UNCLEAN))
            .map(|e| Violation {
                check: "clean-stop",
                key: format!("node {}", e.node.unwrap_or(0)),
                what: format!("{} ({} ms)", e.what, e.start_ms),
                ops: Vec::new(),
            }),
    );
    let expect = Expect {
        store: cluster.totals().await,
        strict_limits: strict_limits(o),
        events: events.clone(),
        // the longest sync period a reload may set
        sync_ms: if o.mode == Mode::Sync { 0 } else { 500 },
    };
    let mut report = check(&history, &expect);
    report.checks += o.nodes * 2;
    violations.append(&mut report.violations);
    report.violations = violations;
    let file = write_out(o, &history, &events);
    Ran {
        history,
        events,
        report,
        day,
        file,
    }
}

/// Each strict namespace's limit: the most a reload may set.
fn strict_limits(o: &Options) -> BTreeMap<String, f64> {
    if o.mode != Mode::Strict {
        return BTreeMap::new();
    }
    let mut out: BTreeMap<String, f64> = NAMESPACES
        .iter()
        .map(|(n, l)| (n.to_string(), *l))
        .collect();
    if o.faults.contains(&Fault::Reload) {
        out.insert(
            "side".into(),
            SIDE_LIMITS.iter().copied().fold(0.0, f64::max),
        );
    }
    out
}

/// Stops every node, starts each again to drain its spool, stops it again: a
/// `clean-stop` violation for each exit that was not 0.
async fn stop(cluster: &Arc<Cluster>) -> Vec<Violation> {
    let mut out = Vec::new();
    for round in ["first stop", "stop after the drain"] {
        let c = cluster.clone();
        let failed = tokio::task::spawn_blocking(move || c.stop_all())
            .await
            .unwrap_or_default();
        out.extend(failed.into_iter().map(|i| Violation {
            check: "clean-stop",
            key: format!("node {i}"),
            what: format!("exited non-zero at the {round}"),
            ops: Vec::new(),
        }));
        if round == "first stop" {
            for i in 0..cluster.nodes.len() {
                let c = cluster.clone();
                let _ = tokio::task::spawn_blocking(move || c.restart(i)).await;
                cluster.ready(i).await;
            }
            // a drained spool is pushed once the store answers: give it a sync or two
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    out
}

fn write_out(o: &Options, history: &[Request], log: &[Event]) -> PathBuf {
    let _ = std::fs::create_dir_all(&o.out);
    let path = o.out.join(format!(
        "history-{:?}-{:?}-{}-c{}-s{}.jsonl",
        o.store, o.mode, o.seed, o.clients, o.seconds
    ));
    if let Ok(mut f) = std::fs::File::create(&path) {
        for r in history {
            let _ = writeln!(f, "{}", serde_json::to_string(r).unwrap_or_default());
        }
        for l in log {
            let _ = writeln!(f, "{}", serde_json::json!({ "nemesis": l }));
        }
    }
    path
}

/// The window a violation is about: the run's day on a namespace of counts.
pub fn window(v: &Violation, day: u64) -> String {
    match v.key.split('/').next() {
        Some("jobs") => "leases in flight".into(),
        Some(ns) if NAMESPACES.iter().any(|(n, _)| *n == ns) => {
            format!("window 86400 s from {day}")
        }
        _ => "the run".into(),
    }
}

/// A violation's line and the requests involved.
pub fn print_violation(v: &Violation, ran: &Ran, lead: &str) {
    println!(
        "violation: {} {} ({}){lead}: {}",
        v.check,
        v.key,
        window(v, ran.day),
        v.what
    );
    let shown: Vec<&Request> = ran
        .history
        .iter()
        .filter(|r| v.ops.contains(&r.op))
        .take(24)
        .collect();
    if !shown.is_empty() {
        println!("  the requests involved:");
    }
    for r in shown {
        println!("  {}", r.line());
    }
}

/// The run's history file, the nemesis's faults, its violations and its tally.
pub fn print(ran: &Ran) {
    println!("history: {}", ran.file.display());
    for l in &ran.events {
        println!("nemesis: {}..{} ms {}", l.start_ms, l.end_ms, l.what);
    }
    for v in &ran.report.violations {
        print_violation(v, ran, "");
    }
    println!(
        "ops {}, checks {}, violations {}",
        ran.history.len(),
        ran.report.checks,
        ran.report.violations.len()
    );
}
