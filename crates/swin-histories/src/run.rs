//! One run: the cluster started, clients and nemesis for the run's seconds, every node
//! stopped cleanly (a node that exits non-zero is a violation), started again once to
//! drain its spool and stopped again, then the checks, printed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::check::{check, Expect, Report, Violation};
use crate::history::{Event, Request};
use crate::nemesis::{self, Fault};
use crate::setup::{Cluster, Mode, StoreKind, NAMESPACES};
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
}

/// Runs, checks and prints; whether no violation was found.
pub async fn run(o: &Options) -> bool {
    let own_redis = o.faults.contains(&Fault::Pause);
    let cluster =
        Arc::new(Cluster::start(o.store, o.mode, o.nodes, own_redis, &o.node_binary).await);
    let rec = Arc::new(Recorder::new());
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(o.seconds);
    let bases = Arc::new(cluster.bases.clone());
    let clients: Vec<_> = (0..o.clients)
        .map(|i| tokio::spawn(Client::new(i, o.seed, bases.clone(), rec.clone()).run(deadline)))
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
    let expect = Expect {
        store: cluster.totals().await,
        strict_limits: strict_limits(o.mode),
        events: events.clone(),
        sync_ms: if o.mode == Mode::Sync { 0 } else { 200 },
    };
    let mut report = check(&history, &expect);
    report.checks += o.nodes * 2;
    violations.append(&mut report.violations);
    report.violations = violations;
    write_out(o, &history, &events);
    print(&history, &events, &report);
    report.violations.is_empty()
}

fn strict_limits(mode: Mode) -> BTreeMap<String, f64> {
    match mode {
        Mode::Strict => NAMESPACES
            .iter()
            .map(|(n, l)| (n.to_string(), *l))
            .collect(),
        _ => BTreeMap::new(),
    }
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

fn write_out(o: &Options, history: &[Request], log: &[Event]) {
    let _ = std::fs::create_dir_all(&o.out);
    let path = o.out.join(format!("history-{}.jsonl", o.seed));
    if let Ok(mut f) = std::fs::File::create(&path) {
        for r in history {
            let _ = writeln!(f, "{}", serde_json::to_string(r).unwrap_or_default());
        }
        for l in log {
            let _ = writeln!(f, "{}", serde_json::json!({ "nemesis": l }));
        }
        println!("history: {}", path.display());
    }
}

fn print(history: &[Request], log: &[Event], report: &Report) {
    for l in log {
        println!("nemesis: {}..{} ms {}", l.start_ms, l.end_ms, l.what);
    }
    for v in &report.violations {
        println!("violation: {} {}: {}", v.check, v.key, v.what);
        let shown: Vec<&Request> = history
            .iter()
            .filter(|r| v.ops.contains(&r.op))
            .take(24)
            .collect();
        if !shown.is_empty() {
            println!("  the requests involved (of unknown outcome, or in flight on a node as its store reply was lost):");
        }
        for r in shown {
            println!("  {}", r.line());
        }
    }
    let ops = history.len();
    println!(
        "ops {ops}, checks {}, violations {}",
        report.checks,
        report.violations.len()
    );
}
