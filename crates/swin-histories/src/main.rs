//! `swin-histories`: the checker `scripts/histories` runs (see `--help`).

use std::path::PathBuf;

use clap::Parser;
use swin_histories::nemesis::{parse_faults, unsupported};
use swin_histories::run::Options;
use swin_histories::setup::{Mode, StoreKind};
use swin_histories::shrink::run_and_shrink;

/// Random histories against a swin cluster under a nemesis, checked: exactly once
/// (each key's store count within what acknowledged requests charged, each request of
/// unknown outcome at most once), bounds (strict: admitted within the limit plus what
/// was given back; leases: slots certainly held within the limit at every instant),
/// answers (`remaining` never promises what the next request of the key is refused,
/// `retry_after` never "now"), idempotency (a retry under one Idempotency-Key answers
/// the first answer), clean stops. Prints the seed first; each violation on a line
/// starting `violation:`, then shrinks the run (the seed again with fewer clients and
/// seconds) and prints the shortest history that still shows it, exit 1; a clean run's
/// last line is `ops N, checks M, violations 0`. The seed reproduces the run up to the
/// interleaving. Exit 2: a fault the store cannot take (lost-reply and cut need a relay
/// to one server; pause, the run's own Redis; skew, a network store and libfaketime).
#[derive(Debug, Parser)]
#[command(name = "swin-histories")]
struct Args {
    /// redis, postgres, sqlite, redis-cluster
    #[arg(long)]
    store: String,
    /// periodic, sync, strict
    #[arg(long)]
    mode: String,
    /// comma list of lost-reply, kill, pause, cut, reload, skew (or none)
    #[arg(long, default_value = "")]
    faults: String,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    #[arg(long, default_value_t = 6)]
    clients: usize,
    /// the swin-node to run
    #[arg(long, default_value = "target/release/swin-node")]
    node_binary: String,
    /// where the history is written
    #[arg(long, default_value = "target/histories")]
    out: PathBuf,
    /// runs a violation's shrinking may take (0: none)
    #[arg(long, default_value_t = 4)]
    shrink_runs: usize,
}

fn parse(a: &Args) -> Result<Options, (i32, String)> {
    let store = match a.store.as_str() {
        "redis" => StoreKind::Redis,
        "postgres" => StoreKind::Postgres,
        "sqlite" => StoreKind::Sqlite,
        "redis-cluster" => StoreKind::RedisCluster,
        other => return Err((64, format!("unknown store {other:?}"))),
    };
    let mode = match a.mode.as_str() {
        "periodic" => Mode::Periodic,
        "sync" => Mode::Sync,
        "strict" => Mode::Strict,
        other => return Err((64, format!("unknown mode {other:?}"))),
    };
    let faults = parse_faults(&a.faults).map_err(|e| (64, e))?;
    if let Some(why) = unsupported(&faults, store) {
        return Err((2, format!("not yet: {why}")));
    }
    Ok(Options {
        store,
        mode,
        faults,
        seconds: a.seconds,
        seed: a.seed,
        nodes: a.nodes.max(1),
        clients: a.clients.max(1),
        node_binary: a.node_binary.clone(),
        out: a.out.clone(),
        shrink_runs: a.shrink_runs,
    })
}

fn main() {
    let args = Args::parse();
    println!("seed {}", args.seed);
    let options = match parse(&args) {
        Ok(o) => o,
        Err((code, e)) => {
            eprintln!("swin-histories: {e}");
            std::process::exit(code);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let clean = rt.block_on(run_and_shrink(&options));
    std::process::exit(if clean { 0 } else { 1 });
}
